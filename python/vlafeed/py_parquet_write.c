/* py_parquet_write.c: Python functions for the parquet_write area (none yet). */
#include "_native.h"

int vf_py_register_parquet_write(PyObject *module)
{
    (void)module;
    return 0;
}
