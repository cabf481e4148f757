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
 *   _native.video_encode(path, frames, fps, *, codec="libsvtav1", gop=2,
 *                        crf=30, preset=None, fast_decode=0, threads=1,
 *                        b_frames=-1)
 *       encodes frames (a C-contiguous uint8 buffer of shape [N, H, W, 3],
 *       RGB; a NumPy array or np.memmap) into a new MP4 at path with the
 *       sample writer's encoder (vf_video_write_episode: LeRobot's PyAV
 *       settings; libsvtav1 cannot take real-time priority). codec:
 *       "libsvtav1"/"av1", "h264"/"libx264", "hevc"/"libx265". preset: an
 *       int for libsvtav1, a name for x264/x265, None for the default.
 *   _native.video_concat(inputs, out, exact=False)
 *       packet-remux concatenation (LeRobot's concatenate_video_files):
 *       files placed at the summed container durations (FFmpeg 5's drift),
 *       or with exact=True at the summed stream durations (no drift, as
 *       LeRobot 0.6's recorder writes).
 *   _native.video_duration(path) -> float seconds (get_video_duration_in_s).
 *   _native.image_write(path, frame)
 *       one RGB uint8 [H, W, 3] buffer to .png (FFmpeg's encoder) or .ppm.
 *
 * The GIL is released while the file is opened and decoded.
 */
#include "_native.h"

#include <string.h>

#include "video/video.h"
#include "vlafeed/vlafeed.h"

#include <stdint.h>

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

/* Borrows an [.., H, W, 3] C-contiguous uint8 buffer; returns 0 or -1 with an exception set. */
static int get_rgb_buffer(PyObject *obj, Py_buffer *view, int min_dims, int max_dims, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *fmt = view->format ? view->format : "B";
    if (view->itemsize != 1 || (strcmp(fmt, "B") && strcmp(fmt, "=B") && strcmp(fmt, "<B") && strcmp(fmt, "|B"))) {
        PyErr_Format(PyExc_TypeError, "%s must be uint8, not buffer format '%s'", what, fmt);
        PyBuffer_Release(view);
        return -1;
    }
    if (view->ndim < min_dims || view->ndim > max_dims || view->shape[view->ndim - 1] != 3) {
        PyErr_Format(PyExc_ValueError, "%s must have shape %s with 3 channels last (got %d dimensions)", what,
                     min_dims == 4 ? "[frames, height, width, 3]" : "[height, width, 3]", view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

typedef struct encode_source {
    const uint8_t *pixels;
    size_t frame_bytes, row_bytes;
    int height;
} encode_source;

static int fill_from_buffer(void *ctx, int64_t frame, uint8_t *pixels, size_t stride)
{
    const encode_source *src = ctx;
    const uint8_t *from = src->pixels + (size_t)frame * src->frame_bytes;
    for (int y = 0; y < src->height; y++)
        memcpy(pixels + (size_t)y * stride, from + (size_t)y * src->row_bytes, src->row_bytes);
    return 0;
}

static PyObject *py_video_encode(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"path",  "frames",      "fps",     "codec",    "gop", "crf",
                               "preset", "fast_decode", "threads", "b_frames", NULL};
    const char *path, *codec = "libsvtav1";
    PyObject *frames, *preset = Py_None;
    int fps, gop = 2, crf = 30, fast_decode = 0, threads = 1, b_frames = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sOi|$siiOiii", keywords, &path, &frames, &fps, &codec, &gop, &crf,
                                     &preset, &fast_decode, &threads, &b_frames))
        return NULL;
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    if (!strcmp(codec, "libsvtav1") || !strcmp(codec, "av1"))
        s.codec = VF_VIDEO_CODEC_AV1;
    else if (!strcmp(codec, "h264") || !strcmp(codec, "libx264"))
        s.codec = VF_VIDEO_CODEC_H264;
    else if (!strcmp(codec, "hevc") || !strcmp(codec, "libx265"))
        s.codec = VF_VIDEO_CODEC_HEVC;
    else
        return PyErr_Format(PyExc_ValueError,
                            "%s: codec '%s' is not one vlafeed encodes (libsvtav1/av1, h264/libx264, hevc/libx265)",
                            path, codec);
    s.fps = fps;
    s.gop = gop;
    s.crf = crf;
    s.fast_decode = fast_decode;
    s.threads = threads;
    s.b_frames = b_frames;
    if (preset == Py_None) {
        if (s.codec != VF_VIDEO_CODEC_AV1)
            s.preset = -1;
    } else if (PyLong_Check(preset) && s.codec == VF_VIDEO_CODEC_AV1) {
        s.preset = (int)PyLong_AsLong(preset);
        if (s.preset == -1 && PyErr_Occurred())
            return NULL;
    } else if (PyUnicode_Check(preset) && s.codec != VF_VIDEO_CODEC_AV1) {
        s.x26x_preset = PyUnicode_AsUTF8(preset);
        if (!s.x26x_preset)
            return NULL;
    } else {
        return PyErr_Format(PyExc_TypeError, "%s: preset must be an int for libsvtav1 and a name for x264/x265",
                            path);
    }
    Py_buffer view;
    if (get_rgb_buffer(frames, &view, 4, 4, "frames") < 0)
        return NULL;
    if (view.shape[0] < 1 || view.shape[1] > INT32_MAX || view.shape[2] > INT32_MAX) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "%s: no frames to encode", path);
    }
    s.height = (int)view.shape[1];
    s.width = (int)view.shape[2];
    encode_source src = {view.buf, (size_t)s.width * 3 * (size_t)s.height, (size_t)s.width * 3, s.height};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_video_write_episode(path, &s, (int64_t)view.shape[0], fill_from_buffer, &src);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc < 0)
        return vf_py_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *py_video_concat(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"inputs", "out", "exact", NULL};
    PyObject *inputs;
    const char *out;
    int exact = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Os|$p", keywords, &inputs, &out, &exact))
        return NULL;
    PyObject *seq = PySequence_Fast(inputs, "inputs must be a sequence of paths");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **paths = n > 0 ? PyMem_Calloc((size_t)n, sizeof *paths) : NULL;
    if (n > 0 && !paths) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        paths[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (!paths[i]) {
            PyMem_Free(paths);
            Py_DECREF(seq);
            return NULL;
        }
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = exact ? vf_video_concat_exact(paths, (size_t)n, out) : vf_video_concat(paths, (size_t)n, out);
    Py_END_ALLOW_THREADS
    PyMem_Free(paths);
    Py_DECREF(seq);
    if (rc < 0)
        return vf_py_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *py_video_duration(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    double seconds = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_video_stream_duration(path, &seconds);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return vf_py_raise(rc);
    return PyFloat_FromDouble(seconds);
}

static PyObject *py_image_write(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path;
    PyObject *frame;
    if (!PyArg_ParseTuple(args, "sO", &path, &frame))
        return NULL;
    Py_buffer view;
    if (get_rgb_buffer(frame, &view, 3, 3, "frame") < 0)
        return NULL;
    if (view.shape[0] < 1 || view.shape[1] < 1 || view.shape[0] > INT32_MAX || view.shape[1] > INT32_MAX) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "%s: empty image", path);
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_image_write(path, view.buf, (int)view.shape[1], (int)view.shape[0]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc < 0)
        return vf_py_raise(rc);
    Py_RETURN_NONE;
}

PyMethodDef vf_py_video_functions[] = {
    VF_PY_KW_FUNCTION("video_encode", py_video_encode,
     "video_encode(path, frames, fps, *, codec='libsvtav1', gop=2, crf=30, preset=None, fast_decode=0, threads=1, "
     "b_frames=-1): frames uint8 [N,H,W,3] RGB -> a new MP4"),
    VF_PY_KW_FUNCTION("video_concat", py_video_concat,
     "video_concat(inputs, out, exact=False): packet-remux concatenation"),
    {"video_duration", py_video_duration, METH_VARARGS, "video_duration(path) -> stream duration in seconds"},
    {"image_write", py_image_write, METH_VARARGS, "image_write(path, frame): RGB uint8 [H,W,3] -> .png or .ppm"},
    VF_PY_KW_FUNCTION("video_frame", py_video_frame,
     "video_frame(path, ordinal, layout='hwc') -> (height, width, bytes)"),
    {"video_info", py_video_info, METH_VARARGS, "video_info(path) -> dict with the frame index summary"},
    {NULL, NULL, 0, NULL},
};
