/* py_parquet_read.c: Python functions for the parquet_read area (none yet). */
#include "_native.h"

int vf_py_register_parquet_read(PyObject *module)
{
    (void)module;
    return 0;
}
