/*
 * test_wds_bombs.c: the WebDataset layer's budgets in C (so ASan/UBSan see
 * them): inputs that declare far more than they hold are refused by their
 * headers, before anything of the declared size is allocated.
 *
 * Cases: a 16x16 JPEG whose frame header says 30000x30000 (decoder and
 * loader); the scaled JPEG decode's size choice; a .npz whose zip headers
 * declare 1 GiB, and npz members over a budget one by one and together; a
 * tar member declaring 1 GiB with no data behind it; a GNU sparse member
 * that expands to 1 GiB; members that are not wanted fields skipped unread
 * whatever their size; a sample over max_sample_bytes; the reader going on
 * after a refused sample when asked to; 1-bit PNGs decoded to 8-bit; the
 * manifest's counts against a shard's size and against the total budget;
 * num_sequences 0 next to a tar with samples; and the loader end to end
 * with on_error skip (a refused image, a batch budget that admits samples
 * in order, the columns compacted).
 */
#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <zlib.h>

#include "testutil.h"
#include "wds/wds.h"

#define GIB ((int64_t)1 << 30)

/* ---- builders -------------------------------------------------------------------------- */

/* A 16x16 JPEG (newly allocated) whose SOF0 then declares width x height. */
static uint8_t *jpeg_declaring(int width, int height, size_t *size)
{
    uint8_t rgb[16 * 16 * 3];
    for (size_t i = 0; i < sizeof rgb; i++)
        rgb[i] = (uint8_t)(i * 7);
    tjhandle tj = tjInitCompress();
    unsigned char *jpeg = NULL;
    unsigned long len = 0;
    CHECK(tjCompress2(tj, rgb, 16, 0, 16, TJPF_RGB, &jpeg, &len, TJSAMP_420, 90, 0) == 0);
    tjDestroy(tj);
    uint8_t *out = malloc(len);
    memcpy(out, jpeg, len);
    tjFree(jpeg);
    for (size_t i = 0; i + 9 < len; i++)
        if (out[i] == 0xff && out[i + 1] == 0xc0) {
            out[i + 5] = (uint8_t)(height >> 8);
            out[i + 6] = (uint8_t)height;
            out[i + 7] = (uint8_t)(width >> 8);
            out[i + 8] = (uint8_t)width;
            break;
        }
    *size = len;
    return out;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static size_t png_chunk(uint8_t *out, const char *kind, const uint8_t *data, size_t len)
{
    put_be32(out, (uint32_t)len);
    memcpy(out + 4, kind, 4);
    if (len)
        memcpy(out + 8, data, len);
    put_be32(out + 8 + len, (uint32_t)crc32(0, out + 4, (uInt)(len + 4)));
    return len + 12;
}

/* An 8x2 1-bit gray PNG: row 0 = 10101010, row 1 = 11110000. */
static size_t png_1bit(uint8_t *out)
{
    uint8_t ihdr[13] = {0, 0, 0, 8, 0, 0, 0, 2, 1, 0, 0, 0, 0};
    uint8_t raw[4] = {0, 0xaa, 0, 0xf0}, idat[64];
    uLongf idat_len = sizeof idat;
    CHECK(compress(idat, &idat_len, raw, sizeof raw) == Z_OK);
    size_t n = 8;
    memcpy(out, "\x89PNG\r\n\x1a\n", 8);
    n += png_chunk(out + n, "IHDR", ihdr, sizeof ihdr);
    n += png_chunk(out + n, "IDAT", idat, idat_len);
    n += png_chunk(out + n, "IEND", NULL, 0);
    return n;
}

/* A .npy v1.0 of n little-endian float32 zeros into out (128 + 4n bytes). */
static size_t npy_f32(uint8_t *out, int n)
{
    char header[118];
    memset(header, ' ', sizeof header);
    int k = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }", n);
    header[k] = ' ';
    header[117] = '\n';
    memcpy(out, "\x93NUMPY\x01\x00\x76\x00", 10);
    memcpy(out + 10, header, sizeof header);
    memset(out + 128, 0, (size_t)n * 4);
    return 128 + (size_t)n * 4;
}

typedef struct member {
    const char *name;
    const void *data;
    size_t len;
} member;

static size_t build_archive(uint8_t *out, size_t cap, int zip, const member *members, size_t n)
{
    struct archive *a = archive_write_new();
    if (zip) {
        archive_write_set_format_zip(a);
        archive_write_set_options(a, "zip:compression=deflate");
    } else {
        archive_write_set_format_ustar(a);
    }
    size_t used = 0;
    archive_write_open_memory(a, out, cap, &used);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, members[i].name);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, (la_int64_t)members[i].len);
        archive_write_header(a, e);
        archive_write_data(a, members[i].data, members[i].len);
        archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return used;
}

static void put_le16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    put_le16(p, v);
    put_le16(p + 2, v >> 16);
}

/* A zip whose one stored member "big.npy" declares `declared` bytes and holds 10. */
static size_t zip_declaring(uint8_t *out, uint32_t declared)
{
    const char *name = "big.npy";
    size_t name_len = strlen(name), n = 0;
    memset(out, 0, 256);
    put_le32(out, 0x04034b50);
    put_le16(out + 4, 20);
    put_le32(out + 18, declared); /* compressed size */
    put_le32(out + 22, declared); /* uncompressed size */
    put_le16(out + 26, (uint32_t)name_len);
    memcpy(out + 30, name, name_len);
    n = 30 + name_len + 10; /* 10 bytes of "data" */
    size_t central = n;
    uint8_t *c = out + n;
    put_le32(c, 0x02014b50);
    put_le16(c + 4, 20);
    put_le16(c + 6, 20);
    put_le32(c + 20, declared);
    put_le32(c + 24, declared);
    put_le16(c + 28, (uint32_t)name_len);
    memcpy(c + 46, name, name_len);
    n += 46 + name_len;
    uint8_t *e = out + n;
    put_le32(e, 0x06054b50);
    put_le16(e + 8, 1);
    put_le16(e + 10, 1);
    put_le32(e + 12, (uint32_t)(n - central));
    put_le32(e + 16, (uint32_t)central);
    return n + 22;
}

static void octal(uint8_t *field, size_t width, uint64_t v)
{
    snprintf((char *)field, width, "%0*llo", (int)width - 1, (unsigned long long)v);
}

static void tar_checksum(uint8_t *h)
{
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
}

/* A ustar header for `name` declaring `size` bytes. */
static void tar_header(uint8_t *h, const char *name, uint64_t size)
{
    memset(h, 0, 512);
    memcpy(h, name, strlen(name));
    octal(h + 100, 8, 0644);
    octal(h + 108, 8, 0);
    octal(h + 116, 8, 0);
    octal(h + 124, 12, size);
    octal(h + 136, 12, 0);
    h[156] = '0';
    memcpy(h + 257, "ustar\0" "00", 8);
    tar_checksum(h);
}

/* A GNU sparse member: 512 stored bytes at the end of a file of real_size bytes. Writes 1024 bytes. */
static void gnu_sparse(uint8_t *out, const char *name, uint64_t real_size)
{
    uint8_t *h = out;
    memset(h, 0, 1024);
    memcpy(h, name, strlen(name));
    octal(h + 100, 8, 0644);
    octal(h + 108, 8, 0);
    octal(h + 116, 8, 0);
    octal(h + 124, 12, 512);
    octal(h + 136, 12, 0);
    h[156] = 'S';
    memcpy(h + 257, "ustar  \0", 8);
    octal(h + 386, 12, real_size - 512);
    octal(h + 398, 12, 512);
    octal(h + 483, 12, real_size);
    tar_checksum(h);
    memset(out + 512, 'x', 512);
}

/* ---- decoders ------------------------------------------------------------------------ */

static void test_image_pixels_refused_by_header(void)
{
    size_t len;
    uint8_t *bomb = jpeg_declaring(30000, 30000, &len);
    int w = 0, h = 0;
    CHECK_OK(vf_wds_image_size(bomb, len, &w, &h));
    CHECK(w == 30000 && h == 30000);
    /* refused before the 2.7 GB buffer: out is never touched */
    CHECK_ERR(vf_wds_decode_image(bomb, len, 0, 0, 0, NULL), VF_ERANGE,
              "image 30000x30000 is 900000000 pixels, above max_image_pixels 67108864");
    CHECK_ERR(vf_wds_decode_image(bomb, len, 224, 224, 1, NULL), VF_ERANGE, "max_image_pixels");
    free(bomb);
    uint8_t *good = jpeg_declaring(16, 16, &len);
    uint8_t rgb[16 * 16 * 3];
    void *tj = NULL;
    CHECK_ERR(vf_wds_decode_image_with(&tj, good, len, 0, 0, 0, 255, rgb), VF_ERANGE,
              "image 16x16 is 256 pixels, above max_image_pixels 255");
    CHECK_OK(vf_wds_decode_image_with(&tj, good, len, 0, 0, 0, 256, rgb));
    vf_wds_jpeg_handle_free(tj);
    free(good);
}

static void test_scaled_decode_size(void)
{
    size_t len;
    uint8_t *jpeg = jpeg_declaring(1024, 768, &len);
    int dw, dh;
    vf_wds_decode_size(jpeg, len, 1024, 768, 128, 96, &dw, &dh);
    CHECK(dw == 256 && dh == 192); /* 1/4: twice the target */
    vf_wds_decode_size(jpeg, len, 1024, 768, 64, 48, &dw, &dh);
    CHECK(dw == 128 && dh == 96);  /* 1/8 */
    vf_wds_decode_size(jpeg, len, 1024, 768, 300, 300, &dw, &dh);
    CHECK(dw == 1024 && dh == 768); /* 1/2 would leave 384 < 600 rows */
    vf_wds_decode_size(jpeg, len, 1024, 768, 2000, 2000, &dw, &dh);
    CHECK(dw == 1024 && dh == 768);
    free(jpeg);
    uint8_t png[256];
    size_t plen = png_1bit(png);
    vf_wds_decode_size(png, plen, 8000, 8000, 100, 100, &dw, &dh);
    CHECK(dw == 8000 && dh == 8000); /* PNG: no scaled decode */
    /* a real image decoded at 1/2 then resized gives the target's size and sane pixels */
    uint8_t src[64 * 48 * 3];
    for (int y = 0; y < 48; y++)
        for (int x = 0; x < 64; x++)
            for (int c = 0; c < 3; c++)
                src[(y * 64 + x) * 3 + c] = (uint8_t)(x * 3 + y + c * 40);
    tjhandle tj = tjInitCompress();
    unsigned char *data = NULL;
    unsigned long size = 0;
    CHECK(tjCompress2(tj, src, 64, 0, 48, TJPF_RGB, &data, &size, TJSAMP_444, 95, 0) == 0);
    tjDestroy(tj);
    uint8_t small[16 * 12 * 3];
    CHECK_OK(vf_wds_decode_image(data, size, 16, 12, 0, small));
    /* the area average of the source's 4x4 blocks */
    double err = 0;
    for (int y = 0; y < 12; y++)
        for (int x = 0; x < 16; x++)
            for (int c = 0; c < 3; c++) {
                double sum = 0;
                for (int dy = 0; dy < 4; dy++)
                    for (int dx = 0; dx < 4; dx++)
                        sum += src[((y * 4 + dy) * 64 + x * 4 + dx) * 3 + c];
                double d = small[(y * 16 + x) * 3 + c] - sum / 16;
                err += d < 0 ? -d : d;
            }
    CHECK(err / (16 * 12 * 3) < 2);
    tjFree(data);
}

static void test_png_low_bit_depth(void)
{
    uint8_t png[256], rgb[8 * 2 * 3];
    size_t len = png_1bit(png);
    CHECK(vf_wds_png_bit_depth(png, len) == 1);
    CHECK_OK(vf_wds_decode_image(png, len, 0, 0, 0, rgb));
    const uint8_t bits[2] = {0xaa, 0xf0};
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 8; x++) {
            uint8_t v = (bits[y] >> (7 - x)) & 1 ? 255 : 0;
            CHECK(rgb[(y * 8 + x) * 3] == v && rgb[(y * 8 + x) * 3 + 1] == v && rgb[(y * 8 + x) * 3 + 2] == v);
        }
}

static void test_npz_budgets(void)
{
    static uint8_t a[128 + 4000], zip[1 << 16];
    size_t alen = npy_f32(a, 1000); /* 4128 bytes */
    member two[] = {{"a.npy", a, alen}, {"b.npy", a, alen}};
    size_t zlen = build_archive(zip, sizeof zip, 1, two, 2);
    CHECK(zlen > 0 && zlen < 1000);
    vf_wds_npz z;
    CHECK_ERR(vf_wds_read_npz_limited(zip, zlen, 4000, &z), VF_ERANGE,
              "npz member a.npy: inflates to 4128 bytes (the npz's arrays: 4128), above max_member_bytes 4000");
    CHECK(z.count == 0);
    CHECK_ERR(vf_wds_read_npz_limited(zip, zlen, 8000, &z), VF_ERANGE,
              "npz member b.npy: inflates to 4128 bytes (the npz's arrays: 8256), above max_member_bytes 8000");
    CHECK_OK(vf_wds_read_npz_limited(zip, zlen, 8256, &z));
    CHECK(z.count == 2 && z.parsed[1] && z.arrays[1].shape[0] == 1000);
    vf_wds_npz_free(&z);
    /* headers declaring 1 GiB over 10 bytes: refused before a byte is allocated for it */
    zlen = zip_declaring(zip, (uint32_t)GIB);
    CHECK_ERR(vf_wds_read_npz(zip, zlen, &z), VF_ERANGE, "npz member big.npy: inflates to 1073741824 bytes");
}

/* ---- the tar reader ------------------------------------------------------------------- */

static void test_reader_fields_and_member_budget(void)
{
    static uint8_t big[65536], tar[1 << 18];
    memset(big, 'b', sizeof big);
    member ms[] = {{"k0.txt", "hello", 5}, {"k0.video.bin", big, sizeof big}, {"k0.cls", "1", 1},
                   {"k1.txt", "world", 5}, {"k1.cls", "2", 1}};
    size_t len = build_archive(tar, sizeof tar, 0, ms, 5);
    char *fields[] = {"txt", "cls"};
    vf_wds_reader_limits limits = {.max_member_bytes = 100, .max_sample_bytes = 1000, .fields = fields,
                                   .num_fields = 2};
    vf_wds_reader *r = NULL;
    const vf_wds_sample *s = NULL;
    /* the 64 KiB member is not a field: skipped unread, no budget applies to it */
    CHECK_OK(vf_wds_reader_open_memory(&r, "f.tar", tar, len));
    vf_wds_reader_set_limits(r, &limits);
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && s->num_members == 3 && s->members[0].data && !s->members[1].data && s->members[2].data);
    CHECK(s && s->members[1].size == sizeof big && !strcmp(s->members[1].suffix, "video.bin"));
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && !strcmp(s->key, "k1") && s->index == 1);
    CHECK(vf_wds_reader_next(r, 1, &s) == VF_EOF);
    vf_wds_reader_close(r);
    /* every member read: the big one is refused by its header, and the reader ends */
    limits.fields = NULL;
    CHECK_OK(vf_wds_reader_open_memory(&r, "f.tar", tar, len));
    vf_wds_reader_set_limits(r, &limits);
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ERANGE,
              "shard f.tar: member k0.video.bin (key k0): 65536 bytes, above max_member_bytes 100");
    CHECK(vf_wds_reader_next(r, 1, &s) == VF_EOF);
    vf_wds_reader_close(r);
    /* skip_refused: the sample is passed over and the next one comes */
    limits.skip_refused = 1;
    CHECK_OK(vf_wds_reader_open_memory(&r, "f.tar", tar, len));
    vf_wds_reader_set_limits(r, &limits);
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ERANGE, "member k0.video.bin (key k0)");
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && !strcmp(s->key, "k1") && s->index == 1 && s->members[0].data &&
          !memcmp(s->members[0].data, "world", 5));
    CHECK(vf_wds_reader_next(r, 1, &s) == VF_EOF);
    vf_wds_reader_close(r);
    /* want = 0 reads nothing, so nothing is refused */
    limits.skip_refused = 0;
    CHECK_OK(vf_wds_reader_open_memory(&r, "f.tar", tar, len));
    vf_wds_reader_set_limits(r, &limits);
    CHECK_OK(vf_wds_reader_next(r, 0, &s));
    CHECK_OK(vf_wds_reader_next(r, 0, &s));
    vf_wds_reader_close(r);
    /* the sample budget: the members read together */
    limits = (vf_wds_reader_limits){.max_member_bytes = 1 << 20, .max_sample_bytes = 60000, .skip_refused = 1};
    CHECK_OK(vf_wds_reader_open_memory(&r, "f.tar", tar, len));
    vf_wds_reader_set_limits(r, &limits);
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ERANGE,
              "member k0.video.bin (key k0): the sample's read members reach 65541 bytes with it, above "
              "max_sample_bytes 60000");
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && !strcmp(s->key, "k1"));
    vf_wds_reader_close(r);
}

static void test_reader_declared_and_sparse_members(void)
{
    static uint8_t tar[8192];
    /* a member declaring 1 GiB, and nothing behind its header */
    tar_header(tar, "k.npy", (uint64_t)GIB);
    vf_wds_reader *r = NULL;
    const vf_wds_sample *s = NULL;
    CHECK_OK(vf_wds_reader_open_memory(&r, "declared.tar", tar, 512));
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ERANGE,
              "shard declared.tar: member k.npy (key k): 1073741824 bytes, above max_member_bytes 268435456");
    vf_wds_reader_close(r);
    /* a GNU sparse member expanding to 1 GiB from 512 stored bytes, then a plain sample */
    gnu_sparse(tar, "k.big.bin", (uint64_t)GIB);
    tar_header(tar + 1024, "k.cls", 1);
    memset(tar + 1536, 0, 512);
    tar[1536] = '7';
    tar_header(tar + 2048, "m.cls", 1);
    memset(tar + 2560, 0, 512 + 1024);
    tar[2560] = '8';
    size_t len = 2560 + 512 + 1024;
    CHECK_OK(vf_wds_reader_open_memory(&r, "sparse.tar", tar, len));
    CHECK_ERR(vf_wds_reader_next(r, 1, &s), VF_ERANGE,
              "member k.big.bin (key k): 1073741824 bytes (a sparse member: the size it expands to), above "
              "max_member_bytes");
    vf_wds_reader_close(r);
    char *fields[] = {"cls"};
    vf_wds_reader_limits limits = {.max_member_bytes = 1 << 20, .max_sample_bytes = 1 << 20, .fields = fields,
                                   .num_fields = 1};
    CHECK_OK(vf_wds_reader_open_memory(&r, "sparse.tar", tar, len));
    vf_wds_reader_set_limits(r, &limits);
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && s->num_members == 2 && !s->members[0].data && s->members[0].size == (size_t)GIB);
    CHECK(s && s->members[1].data && s->members[1].data[0] == '7');
    CHECK_OK(vf_wds_reader_next(r, 1, &s));
    CHECK(s && !strcmp(s->key, "m") && s->members[0].data[0] == '8');
    CHECK(vf_wds_reader_next(r, 1, &s) == VF_EOF);
    vf_wds_reader_close(r);
}

/* ---- manifest and loader ----------------------------------------------------------------- */

static void write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
}

static void test_manifest_counts(void)
{
    char *dir = vf_test_tmpdir("wds_bombs_manifest");
    static uint8_t tar[1 << 14];
    member one[] = {{"k.cls", "1", 1}};
    size_t len = build_archive(tar, sizeof tar, 0, one, 1);
    write_file(dir, "shard_000000.tar", tar, len);
    const char *text = "{\"shard\": \"shard_000000\", \"num_sequences\": 1}\n"
                       "{\"shard\": \"shard_000000\", \"num_sequences\": 1e9}\n";
    write_file(dir, "manifest.jsonl", text, strlen(text));
    char manifest[1024];
    snprintf(manifest, sizeof manifest, "%s/manifest.jsonl", dir);
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    CHECK(s.max_image_pixels == 8192 * 8192 && s.max_member_bytes == 256 << 20 && s.max_sample_bytes == GIB &&
          s.max_batch_bytes == 8 * GIB && s.max_manifest_samples == 1 << 28);
    vf_wds_loader *l = NULL;
    CHECK_ERR(vf_wds_loader_open(&l, manifest, &s), VF_ECORRUPT, "manifest.jsonl:2: shard ");
    CHECK(strstr(vf_last_error(), "num_sequences 1000000000 cannot be right: the file has 2048 bytes, room for "
                                  "at most 4 samples"));
    /* remote shards: not fetched at open, held to the total */
    const char *remote = "{\"shard\": \"s3://b/k/x0\", \"num_sequences\": 134217728}\n"
                         "{\"shard\": \"s3://b/k/x1\", \"num_sequences\": 134217728}\n"
                         "{\"shard\": \"s3://b/k/x2\", \"num_sequences\": 1}\n";
    vf_wds_manifest *m = NULL;
    CHECK_OK(vf_wds_manifest_parse(&m, "s3://b/k/manifest.jsonl", remote, strlen(remote)));
    CHECK_ERR(vf_wds_manifest_check_counts(m, (int64_t)1 << 28), VF_ECORRUPT,
              "s3://b/k/manifest.jsonl:3: shard s3://b/k/x2.tar: num_sequences 1 brings the manifest to 268435457 "
              "samples, above max_manifest_samples 268435456");
    CHECK_OK(vf_wds_manifest_check_counts(m, ((int64_t)1 << 28) + 1));
    CHECK(vf_wds_manifest_shard_line(m, 2) == 3);
    vf_wds_manifest_close(m);
    s.max_manifest_samples = 0;
    CHECK_ERR(vf_wds_loader_open(&l, manifest, &s), VF_EINVAL, "max_manifest_samples must be >= 1");
    vf_test_rmtree(dir);
    free(dir);
}

static void test_zero_count_shard(void)
{
    char *dir = vf_test_tmpdir("wds_bombs_zero");
    static uint8_t tar[1 << 14];
    member ms[] = {{"a.cls", "1", 1}, {"b.cls", "2", 1}};
    size_t len = build_archive(tar, sizeof tar, 0, ms, 2);
    write_file(dir, "shard_000000.tar", tar, len);
    write_file(dir, "shard_000001.tar", tar, len);
    len = build_archive(tar, sizeof tar, 0, NULL, 0);
    write_file(dir, "shard_000002.tar", tar, len);
    const char *text = "{\"shard\": \"shard_000000\", \"num_sequences\": 2}\n"
                       "{\"shard\": \"shard_000001\", \"num_sequences\": 0}\n"
                       "{\"shard\": \"shard_000002\", \"num_sequences\": 0}\n"
                       "{\"shard\": \"missing\", \"num_sequences\": 0}\n";
    write_file(dir, "manifest.jsonl", text, strlen(text));
    char manifest[1024];
    snprintf(manifest, sizeof manifest, "%s/manifest.jsonl", dir);
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    s.shuffle = 0;
    vf_wds_loader *l = NULL;
    CHECK_ERR(vf_wds_loader_open(&l, manifest, &s), VF_ECORRUPT,
              "manifest.jsonl:2: shard ");
    CHECK(strstr(vf_last_error(), "shard_000001.tar has num_sequences 0 but its tar holds samples (first key a)"));
    s.on_error = VF_WDS_SKIP;
    CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
    vf_wds_stats st;
    vf_wds_loader_stats(l, &st);
    CHECK(st.skipped_shards == 1 && vf_wds_loader_num_skip_messages(l) == 1);
    CHECK(vf_wds_loader_num_samples(l) == 2);
    vf_wds_loader_close(l);
    vf_test_rmtree(dir);
    free(dir);
}

/* A shard of 8 samples (jpg + cls + an unrequested 64 KiB .bin), sample 2's JPEG declaring 30000x30000. */
static void write_image_set(const char *dir)
{
    static uint8_t tar[1 << 20], big[65536];
    size_t good_len, bomb_len;
    uint8_t *good = jpeg_declaring(16, 16, &good_len), *bomb = jpeg_declaring(30000, 30000, &bomb_len);
    member ms[24];
    char names[24][32], cls[8][4];
    for (int i = 0; i < 8; i++) {
        snprintf(names[3 * i], 32, "k%d.jpg", i);
        snprintf(names[3 * i + 1], 32, "k%d.cls", i);
        snprintf(names[3 * i + 2], 32, "k%d.video.bin", i);
        snprintf(cls[i], sizeof cls[i], "%d", i);
        ms[3 * i] = (member){names[3 * i], i == 2 ? bomb : good, i == 2 ? bomb_len : good_len};
        ms[3 * i + 1] = (member){names[3 * i + 1], cls[i], strlen(cls[i])};
        ms[3 * i + 2] = (member){names[3 * i + 2], big, sizeof big};
    }
    size_t len = build_archive(tar, sizeof tar, 0, ms, 24);
    write_file(dir, "shard_000000.tar", tar, len);
    const char *text = "{\"shard\": \"shard_000000\", \"num_sequences\": 8}";
    write_file(dir, "manifest.jsonl", text, strlen(text));
    free(good);
    free(bomb);
}

/* Drains the loader; fills keys (the cls values, which equal the key numbers) and batch sizes. */
static int drain(vf_wds_loader *l, int *values, int *num_values, int *sizes, int *num_batches)
{
    vf_wds_batch *b;
    int r;
    while ((r = vf_wds_loader_next(l, &b)) == 0) {
        const vf_wds_column *cls = NULL, *jpg = NULL;
        for (size_t c = 0; c < b->num_columns; c++) {
            if (!strcmp(b->columns[c].name, "cls"))
                cls = &b->columns[c];
            if (!strcmp(b->columns[c].name, "jpg"))
                jpg = &b->columns[c];
        }
        CHECK(cls && jpg && cls->shape[0] == (int64_t)b->size && jpg->shape[0] == (int64_t)b->size);
        CHECK(jpg && jpg->nbytes == b->size * 16 * 16 * 3);
        for (size_t i = 0; cls && i < b->size; i++) {
            int v = (int)((int64_t *)cls->data)[i];
            char key[8];
            snprintf(key, sizeof key, "k%d", v);
            CHECK(!strcmp(b->keys[i], key) && b->positions[i] == v);
            values[(*num_values)++] = v;
        }
        sizes[(*num_batches)++] = (int)b->size;
        vf_wds_batch_free(b);
    }
    return r;
}

/* A fresh folder `name` filled by write(dir); its manifest's path goes to manifest. The caller removes
 * and frees the folder. */
static char *shard_set(const char *name, void (*write)(const char *dir), char *manifest, size_t manifest_size)
{
    char *dir = vf_test_tmpdir(name);
    write(dir);
    snprintf(manifest, manifest_size, "%s/manifest.jsonl", dir);
    return dir;
}

static void test_loader_budgets(void)
{
    char manifest[1024];
    char *dir = shard_set("wds_bombs_loader", write_image_set, manifest, sizeof manifest);
    for (int prefetch = 0; prefetch < 2; prefetch++) {
        vf_wds_loader_settings s;
        vf_wds_loader_defaults(&s);
        s.shuffle = 0;
        s.batch_size = 4;
        s.prefetch = (size_t)prefetch;
        s.fields = "jpg,cls";
        vf_wds_loader *l = NULL;
        int values[16], sizes[8], nv = 0, nb = 0;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        CHECK_ERR(drain(l, values, &nv, sizes, &nb), VF_ECORRUPT,
                  "member k2.jpg (key k2): image 30000x30000 is 900000000 pixels, above max_image_pixels");
        vf_wds_loader_close(l);
        /* skip: the bomb is left out and counted; the 64 KiB members are never read */
        s.on_error = VF_WDS_SKIP;
        nv = nb = 0;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        CHECK(drain(l, values, &nv, sizes, &nb) == VF_EOF);
        CHECK(nv == 7 && nb == 2 && sizes[0] == 3 && sizes[1] == 4 && values[2] == 3);
        vf_wds_stats st;
        vf_wds_loader_stats(l, &st);
        CHECK(st.skipped_samples == 1 && st.bytes_read < 8 * 2000);
        CHECK(strstr(vf_wds_loader_skip_message(l, 0), "max_image_pixels"));
        vf_wds_loader_close(l);
        /* a batch budget of 2 rows (768 + 8 bytes each): the rest of each batch is refused, in order */
        s.max_batch_bytes = 2 * (16 * 16 * 3 + 8) + 100;
        nv = nb = 0;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        CHECK(drain(l, values, &nv, sizes, &nb) == VF_EOF);
        CHECK(nv == 4 && nb == 2 && values[0] == 0 && values[1] == 1 && values[2] == 4 && values[3] == 5);
        vf_wds_loader_stats(l, &st);
        CHECK(st.skipped_samples == 4);
        CHECK(strstr(vf_wds_loader_skip_message(l, 1), "key k3: the batch's columns would reach 2328 bytes with "
                                                       "this sample (2 before it), above max_batch_bytes 1652"));
        vf_wds_loader_close(l);
        /* the member budget applies to read members only */
        s.max_batch_bytes = 8 * GIB;
        s.max_member_bytes = 1000;
        s.fields = "cls,video.bin";
        s.on_error = VF_WDS_RAISE;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        vf_wds_batch *b = NULL;
        CHECK_ERR(vf_wds_loader_next(l, &b), VF_ECORRUPT,
                  "member k0.video.bin (key k0): 65536 bytes, above max_member_bytes 1000");
        vf_wds_loader_close(l);
    }
    vf_test_rmtree(dir);
    free(dir);
}

/* 48 samples of a 1000-byte .bin and a .cls (the key's number). */
static void write_buffer_set(const char *dir)
{
    static uint8_t tar[1 << 20], bin[1000];
    member ms[96];
    char names[96][32], cls[48][4];
    for (int i = 0; i < 48; i++) {
        snprintf(names[2 * i], 32, "k%d.bin", i);
        snprintf(names[2 * i + 1], 32, "k%d.cls", i);
        snprintf(cls[i], sizeof cls[i], "%d", i);
        ms[2 * i] = (member){names[2 * i], bin, sizeof bin};
        ms[2 * i + 1] = (member){names[2 * i + 1], cls[i], strlen(cls[i])};
    }
    size_t len = build_archive(tar, sizeof tar, 0, ms, 96);
    write_file(dir, "shard_000000.tar", tar, len);
    const char *text = "{\"shard\": \"shard_000000\", \"num_sequences\": 48}";
    write_file(dir, "manifest.jsonl", text, strlen(text));
}

/* Drains the loader into values (the .cls column); returns the last result, and the error's text in
 * message (when there is one). */
static int drain_cls(vf_wds_loader *l, int *values, int *num_values, char *message, size_t message_size)
{
    vf_wds_batch *b;
    int r;
    *num_values = 0;
    while ((r = vf_wds_loader_next(l, &b)) == 0) {
        for (size_t c = 0; c < b->num_columns; c++)
            if (!strcmp(b->columns[c].name, "cls"))
                for (size_t i = 0; i < b->size; i++)
                    values[(*num_values)++] = (int)((int64_t *)b->columns[c].data)[i];
        vf_wds_batch_free(b);
    }
    snprintf(message, message_size, "%s", r == VF_EOF ? "" : vf_last_error());
    return r;
}

/* max_buffer_bytes bounds the samples held between reading and delivery; the sample that would pass it
 * fails the pass at the same point on every run, whatever the prefetch or policy, and the batches before
 * it are those of an unbounded run. */
static void test_buffer_budget(void)
{
    char manifest[1024];
    char *dir = shard_set("wds_bombs_buffer", write_buffer_set, manifest, sizeof manifest);
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    s.batch_size = 4;
    s.shuffle_buffer = 16;
    s.seed = 3;
    s.fields = "bin,cls";
    vf_wds_loader *l = NULL;
    int whole[48], got[48], n_whole = 0, n_got = 0;
    char message[1024], first[1024];
    s.max_buffer_bytes = 0;
    CHECK_ERR(vf_wds_loader_open(&l, manifest, &s), VF_EINVAL, "max_buffer_bytes must be >= 1");
    s.max_buffer_bytes = VF_WDS_DEFAULT_MAX_BUFFER_BYTES;
    CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
    CHECK(drain_cls(l, whole, &n_whole, message, sizeof message) == VF_EOF && n_whole == 48);
    vf_wds_loader_close(l);
    first[0] = 0;
    s.max_buffer_bytes = 8 * 1002;
    for (int run = 0; run < 4; run++) {
        s.prefetch = (size_t)(run % 2 ? 2 : 0);
        s.on_error = run < 2 ? VF_WDS_RAISE : VF_WDS_SKIP;
        CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
        CHECK(drain_cls(l, got, &n_got, message, sizeof message) == VF_ECORRUPT);
        CHECK(strstr(message, "shard_000000.tar: member k") && strstr(message, ".bin (key k"));
        CHECK(strstr(message, "above max_buffer_bytes 8016; raise max_buffer_bytes or lower shuffle_buffer (16)"));
        if (run == 0)
            snprintf(first, sizeof first, "%s", message);
        CHECK(!strcmp(message, first));
        /* what came before the refusal is the unbounded run's start, nothing left out */
        CHECK(n_got < 48 && n_got % 4 == 0);
        for (int i = 0; i < n_got; i++)
            CHECK(got[i] == whole[i]);
        /* the refusal is repeated, not skipped past */
        vf_wds_batch *b = NULL;
        CHECK(vf_wds_loader_next(l, &b) == VF_ECORRUPT && b == NULL);
        vf_wds_loader_close(l);
    }
    /* in tar order (no shuffle buffer) one sample is held at a time: 1002 bytes are enough (k10 on: 1002) */
    s.shuffle = 0;
    s.max_buffer_bytes = 1002;
    CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
    CHECK(drain_cls(l, got, &n_got, message, sizeof message) == VF_EOF && n_got == 48);
    vf_wds_loader_close(l);
    s.max_buffer_bytes = 1000;
    CHECK_OK(vf_wds_loader_open(&l, manifest, &s));
    CHECK(drain_cls(l, got, &n_got, message, sizeof message) == VF_ECORRUPT && n_got == 0);
    CHECK(strstr(message, "member k0.bin (key k0): holding this sample until its turn would bring the read-ahead "
                          "buffer to 1001 bytes (0 samples held before it), above max_buffer_bytes 1000; raise "
                          "max_buffer_bytes or lower shuffle_buffer (0)"));
    vf_wds_loader_close(l);
    vf_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    test_image_pixels_refused_by_header();
    test_scaled_decode_size();
    test_png_low_bit_depth();
    test_npz_budgets();
    test_reader_fields_and_member_budget();
    test_reader_declared_and_sparse_members();
    test_manifest_counts();
    test_zero_count_shard();
    test_loader_budgets();
    test_buffer_budget();
    return vf_test_finish("test_wds_bombs");
}
