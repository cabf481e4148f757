/* py_video.c: Python functions for the video area (none yet). */
#include "_native.h"

int vf_py_register_video(PyObject *module)
{
    (void)module;
    return 0;
}
