/* py_dataset.c: Python functions for the dataset area (none yet). */
#include "_native.h"

int vf_py_register_dataset(PyObject *module)
{
    (void)module;
    return 0;
}
