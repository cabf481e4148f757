/*
 * py_video.c: Python functions for the video area, for tests and quick
 * checks (the loader reaches video through the engine, not through these).
 *
 *   _native.video_frame(path, ordinal, layout="hwc") -> (height, width, bytes)
 *       one frame by ordinal, RGB uint8 in HWC or CHW order ("hwc", "chw"),
 *       or float32 CHW ("chw_f32", value / 255), decoded with libdav1d /
 *       FFmpeg and converted with swscale (bilinear).
 *   _native.video_info(path) -> dict
 *       the frame index summary: codec, pix_fmt, width, height, frames,
 *       keyframes, time_base (num, den), pts (list of ints).
 *
 * The GIL is released while the file is opened and decoded.
 */
#include "_native.h"

#include <string.h>

#include "video/video.h"

static PyObject *py_video_frame(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"path", "ordinal", "layout", NULL};
    const char *path, *layout_name = "hwc";
    long long ordinal;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sL|s", keywords, &path, &ordinal, &layout_name))
        return NULL;
    vf_video_format format;
    vf_video_format_defaults(&format);
    if (!strcmp(layout_name, "hwc"))
        format.layout = VF_VIDEO_RGB_HWC_U8;
    else if (!strcmp(layout_name, "chw"))
        format.layout = VF_VIDEO_RGB_CHW_U8;
    else if (!strcmp(layout_name, "chw_f32"))
        format.layout = VF_VIDEO_RGB_CHW_F32;
    else
        return PyErr_Format(PyExc_ValueError, "layout must be 'hwc', 'chw' or 'chw_f32', not '%s'", layout_name);

    vf_video_reader *reader = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_video_open_file(&reader, path, NULL);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return vf_py_raise(rc);
    const vf_video_index *ix = vf_video_reader_index(reader);
    int w = ix->width, h = ix->height;
    size_t size = vf_video_format_bytes(&format, w, h);
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!bytes) {
        vf_video_close(reader);
        return NULL;
    }
    char *dest = PyBytes_AS_STRING(bytes);
    Py_BEGIN_ALLOW_THREADS
    rc = vf_video_read_frame(reader, (int64_t)ordinal, &format, dest);
    vf_video_close(reader);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(bytes);
        return vf_py_raise(rc);
    }
    return Py_BuildValue("(iiN)", h, w, bytes);
}

static PyObject *py_video_info(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    vf_video_index *ix = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_video_index_build_file(&ix, path);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return vf_py_raise(rc);
    PyObject *pts = PyList_New((Py_ssize_t)ix->frame_count);
    for (int64_t i = 0; pts && i < ix->frame_count; i++) {
        PyObject *v = PyLong_FromLongLong(ix->pts[i]);
        if (!v) {
            Py_CLEAR(pts);
            break;
        }
        PyList_SET_ITEM(pts, (Py_ssize_t)i, v);
    }
    PyObject *info = pts ? Py_BuildValue("{s:s,s:s,s:i,s:i,s:L,s:L,s:(ii),s:N}", "codec", ix->codec_name, "pix_fmt",
                                         ix->pixfmt_name, "width", ix->width, "height", ix->height, "frames",
                                         (long long)ix->frame_count, "keyframes", (long long)ix->keyframe_count,
                                         "time_base", ix->time_base_num, ix->time_base_den, "pts", pts)
                         : NULL;
    vf_video_index_free(ix);
    return info;
}

PyMethodDef vf_py_video_functions[] = {
    VF_PY_KW_FUNCTION("video_frame", py_video_frame,
     "video_frame(path, ordinal, layout='hwc') -> (height, width, bytes)"),
    {"video_info", py_video_info, METH_VARARGS, "video_info(path) -> dict with the frame index summary"},
    {NULL, NULL, 0, NULL},
};
