/*
 * http_s3_list.c: vf_http_list, the names one level below an s3:// prefix
 * (ListObjectsV2 with delimiter '/', every page followed through its
 * continuation token), each page a signed GET through http_request.c.
 *
 * The XML is read by hand and defensively: only the elements wanted are
 * looked for, entities are decoded (the five named ones and numeric
 * references, as UTF-8), and a page, the number of pages and the number of
 * entries are bounded (MAX_LIST_PAGE, MAX_LIST_PAGES, MAX_LIST_ENTRIES).
 * Names come back without the prefix and without a trailing '/', each once.
 */
#define _GNU_SOURCE
#include "io/http_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_LIST_PAGE (16u << 20)     /* one S3 list page */
#define MAX_LIST_PAGES 10000
#define MAX_LIST_ENTRIES 1000000

/* ---- S3 listing ------------------------------------------------------------------ */

/* Decodes XML character data [a, b) (the five entities and &#N; / &#xN;). */
static char *xml_text(const char *a, const char *b)
{
    vf_buf out = {0};
    int r = 0;
    while (a < b && r == 0) {
        if (*a != '&') {
            r = vf_buf_append_u8(&out, (uint8_t)*a++);
            continue;
        }
        const char *semi = memchr(a, ';', (size_t)(b - a));
        if (!semi || semi - a > 10) {
            r = vf_buf_append_u8(&out, (uint8_t)*a++);
            continue;
        }
        size_t n = (size_t)(semi - a - 1);
        const char *e = a + 1;
        unsigned long cp = 0;
        if (n == 3 && !strncmp(e, "amp", 3))
            cp = '&';
        else if (n == 2 && !strncmp(e, "lt", 2))
            cp = '<';
        else if (n == 2 && !strncmp(e, "gt", 2))
            cp = '>';
        else if (n == 4 && !strncmp(e, "quot", 4))
            cp = '"';
        else if (n == 4 && !strncmp(e, "apos", 4))
            cp = '\'';
        else if (n >= 2 && e[0] == '#') {
            char tmp[12];
            memcpy(tmp, e + 1, n - 1);
            tmp[n - 1] = '\0';
            char *end;
            cp = (tmp[0] == 'x' || tmp[0] == 'X') ? strtoul(tmp + 1, &end, 16) : strtoul(tmp, &end, 10);
            if (*end || cp == 0 || cp > 0x10FFFF)
                cp = 0;
        }
        if (!cp) {
            r = vf_buf_append_u8(&out, (uint8_t)*a++);
            continue;
        }
        uint8_t u[4];
        size_t k;
        if (cp < 0x80) {
            u[0] = (uint8_t)cp;
            k = 1;
        } else if (cp < 0x800) {
            u[0] = (uint8_t)(0xC0 | (cp >> 6));
            u[1] = (uint8_t)(0x80 | (cp & 0x3F));
            k = 2;
        } else if (cp < 0x10000) {
            u[0] = (uint8_t)(0xE0 | (cp >> 12));
            u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (uint8_t)(0x80 | (cp & 0x3F));
            k = 3;
        } else {
            u[0] = (uint8_t)(0xF0 | (cp >> 18));
            u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            u[3] = (uint8_t)(0x80 | (cp & 0x3F));
            k = 4;
        }
        r = vf_buf_append(&out, u, k);
        a = semi + 1;
    }
    if (r < 0) {
        vf_buf_free(&out);
        return NULL;
    }
    return vf_buf_take_string(&out);
}

/* The text of the first <tag>...</tag> inside [a, b), or NULL (not found). */
static const char *xml_find(const char *a, const char *b, const char *tag, const char **text_end)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *s = memmem(a, (size_t)(b - a), open, strlen(open));
    if (!s)
        return NULL;
    s += strlen(open);
    const char *e = memmem(s, (size_t)(b - s), close, strlen(close));
    if (!e)
        return NULL;
    *text_end = e;
    return s;
}

typedef struct name_list {
    char **names;
    size_t count, cap;
} name_list;

static int add_name(name_list *l, const char *name, size_t len)
{
    for (size_t i = 0; i < l->count; i++)
        if (strlen(l->names[i]) == len && !memcmp(l->names[i], name, len))
            return 0;
    if (l->count >= MAX_LIST_ENTRIES)
        return vf_error(VF_ERANGE, "more than %d entries in one listing", MAX_LIST_ENTRIES);
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **grown = vf_realloc(l->names, cap * sizeof *grown);
        if (!grown)
            return VF_ENOMEM;
        l->names = grown;
        l->cap = cap;
    }
    if (!(l->names[l->count] = vf_strndup(name, len)))
        return VF_ENOMEM;
    l->count++;
    return 0;
}

/* Adds the entries of one ListObjectsV2 page; *token gets the next
 * continuation token (NULL when the listing is complete). */
static int parse_list_page(const char *url, const char *xml, size_t len, const char *prefix, name_list *l,
                           char **token)
{
    *token = NULL;
    const char *end = xml + len;
    if (!memmem(xml, len, "<ListBucketResult", 17))
        return vf_error(VF_ECORRUPT, "%s: the listing is not a ListBucketResult document", url);
    size_t plen = strlen(prefix);
    int r = 0;
    static const char *const blocks[2][2] = {{"CommonPrefixes", "Prefix"}, {"Contents", "Key"}};
    for (int k = 0; k < 2 && r == 0; k++) {
        char open[32], close[32];
        snprintf(open, sizeof open, "<%s>", blocks[k][0]);
        snprintf(close, sizeof close, "</%s>", blocks[k][0]);
        const char *p = xml;
        while (r == 0 && (p = memmem(p, (size_t)(end - p), open, strlen(open))) != NULL) {
            const char *block_end = memmem(p, (size_t)(end - p), close, strlen(close));
            if (!block_end)
                return vf_error(VF_ECORRUPT, "%s: unclosed <%s> in the listing", url, blocks[k][0]);
            const char *text_end;
            const char *text = xml_find(p, block_end, blocks[k][1], &text_end);
            p = block_end + strlen(close);
            if (!text)
                continue;
            char *value = xml_text(text, text_end);
            if (!value)
                return VF_ENOMEM;
            size_t vlen = strlen(value);
            if (vlen > plen && !strncmp(value, prefix, plen)) {
                const char *name = value + plen;
                size_t nlen = vlen - plen;
                if (nlen && name[nlen - 1] == '/')
                    nlen--;
                if (nlen && !memchr(name, '/', nlen))
                    r = add_name(l, name, nlen);
            }
            free(value);
        }
    }
    const char *te;
    const char *trunc = xml_find(xml, end, "IsTruncated", &te);
    if (r == 0 && trunc && te - trunc == 4 && !strncmp(trunc, "true", 4)) {
        const char *tok = xml_find(xml, end, "NextContinuationToken", &te);
        if (!tok)
            return vf_error(VF_ECORRUPT, "%s: truncated listing without a continuation token", url);
        *token = xml_text(tok, te);
        if (!*token)
            return VF_ENOMEM;
    }
    return r;
}

int vf_http_list(vf_http_client *c, const char *url, char ***names, size_t *count)
{
    *names = NULL;
    *count = 0;
    vf_url u;
    int r = vf_url_parse(url, &u);
    if (r < 0)
        return r;
    if (strcmp(u.scheme, "s3") != 0) {
        vf_url_free(&u);
        return vf_error(VF_EUNSUPPORTED, "%s: HTTP has no directory listing (only s3:// URLs can be listed)", url);
    }
    /* prefix: the key with one trailing '/' (empty for the bucket root) */
    const char *key = u.path + 1;
    size_t klen = strlen(key);
    while (klen && key[klen - 1] == '/')
        klen--;
    char *prefix = klen ? vf_asprintf("%.*s/", (int)klen, key) : vf_strdup("");
    char *bucket_url = vf_asprintf("s3://%s/", u.host);
    vf_url_free(&u);
    name_list l = {0};
    char *token = NULL;
    if (!prefix || !bucket_url)
        r = VF_ENOMEM;
    for (int page = 0; r == 0; page++) {
        if (page >= MAX_LIST_PAGES) {
            r = vf_error(VF_ERANGE, "%s: more than %d listing pages", url, MAX_LIST_PAGES);
            break;
        }
        /* Query parameters sorted by name, AWS-encoded (signed as sent). */
        vf_buf q = {0};
        if (token) {
            r = vf_buf_printf(&q, "continuation-token=");
            if (r == 0)
                r = vf_aws_uri_encode(&q, token, strlen(token), 0);
            if (r == 0)
                r = vf_buf_append_u8(&q, '&');
        }
        if (r == 0)
            r = vf_buf_printf(&q, "delimiter=%%2F&list-type=2&prefix=");
        if (r == 0)
            r = vf_aws_uri_encode(&q, prefix, strlen(prefix), 0);
        char *query = r == 0 ? vf_buf_take_string(&q) : NULL;
        vf_buf_free(&q);
        if (r == 0 && !query)
            r = VF_ENOMEM;
        free(token);
        token = NULL;
        if (r < 0) {
            free(query);
            break;
        }
        vf_buf body = {0};
        vf_http_xfer x;
        vf_http_xfer_init(&x, c, bucket_url);
        x.query = query;
        x.sink = VF_HTTP_SINK_GROW;
        x.grow = &body;
        x.max_bytes = MAX_LIST_PAGE;
        r = vf_http_perform(&x);
        free(query);
        if (r < 0) {
            r = vf_error_context(r, "listing %s", url);
        } else {
            char *text = vf_buf_take_string(&body);
            r = text ? parse_list_page(url, text, body.len ? body.len : strlen(text), prefix, &l, &token) : VF_ENOMEM;
            free(text);
        }
        vf_buf_free(&body);
        if (r < 0 || !token)
            break;
    }
    free(token);
    free(prefix);
    free(bucket_url);
    if (r == 0 && l.count == 0)
        r = vf_error(VF_ENOENT, "%s: nothing stored under this prefix", url);
    if (r < 0) {
        for (size_t i = 0; i < l.count; i++)
            free(l.names[i]);
        free(l.names);
        return r;
    }
    *names = l.names;
    *count = l.count;
    return 0;
}

