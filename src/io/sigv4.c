/*
 * sigv4.c: AWS Signature Version 4 for S3 requests (the header form:
 * Authorization: AWS4-HMAC-SHA256 ...), SHA-256 and HMAC from OpenSSL's
 * libcrypto.
 *
 * The steps follow AWS's documented algorithm: a canonical request
 * (method, URI, sorted query, sorted lower-case headers, signed header
 * list, payload hash), its SHA-256 in the string to sign with the
 * credential scope date/region/service/aws4_request, and a signing key
 * derived by chained HMACs from "AWS4" + secret key.
 *
 * Invariants: no state; every output string is newly allocated; inputs are
 * used as given (callers pass the path and query exactly as they send
 * them, so what is signed is what is sent).
 */
#include "io/io.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <string.h>

static void to_hex(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

void vf_sha256_hex(const void *data, size_t len, char out[65])
{
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32) {
        out[0] = '\0';
        return;
    }
    to_hex(md, 32, out);
}

static int hmac_sha256(const void *key, size_t key_len, const char *msg, uint8_t out[32])
{
    unsigned int n = 0;
    if (!HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), out, &n) || n != 32)
        return vf_error(VF_EIO, "HMAC-SHA256 failed (libcrypto)");
    return 0;
}

int vf_aws_uri_encode(vf_buf *b, const char *s, size_t len, int keep_slash)
{
    static const char digits[] = "0123456789ABCDEF";
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        int keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                   ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/');
        int r;
        if (keep) {
            r = vf_buf_append_u8(b, ch);
        } else {
            char esc[3] = {'%', digits[ch >> 4], digits[ch & 15]};
            r = vf_buf_append(b, esc, 3);
        }
        if (r < 0)
            return r;
    }
    return 0;
}

/* One query parameter as sent ("name=value", both already encoded). */
typedef struct query_param {
    const char *text;
    size_t len, name_len;
} query_param;

static int cmp_param(const void *pa, const void *pb)
{
    const query_param *a = pa, *b = pb;
    size_t n = VF_MIN(a->name_len, b->name_len);
    int c = memcmp(a->text, b->text, n);
    if (c)
        return c;
    if (a->name_len != b->name_len)
        return a->name_len < b->name_len ? -1 : 1;
    n = VF_MIN(a->len, b->len);
    c = memcmp(a->text, b->text, n);
    if (c)
        return c;
    return (a->len > b->len) - (a->len < b->len);
}

/* Sorted parameters joined by '&', each as "name=value" ("name=" when the
 * parameter had no '='). */
static int canonical_query(vf_buf *b, const char *query)
{
    if (!query || !*query)
        return 0;
    size_t count = 1;
    for (const char *p = query; *p; p++)
        count += *p == '&';
    query_param *params = vf_malloc_array(count, sizeof *params);
    if (!params)
        return VF_ENOMEM;
    size_t n = 0;
    for (const char *p = query;;) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len) {
            const char *eq = memchr(p, '=', len);
            params[n].text = p;
            params[n].len = len;
            params[n].name_len = eq ? (size_t)(eq - p) : len;
            n++;
        }
        if (!amp)
            break;
        p = amp + 1;
    }
    qsort(params, n, sizeof *params, cmp_param);
    int r = 0;
    for (size_t i = 0; i < n && r == 0; i++) {
        if (i)
            r = vf_buf_append_u8(b, '&');
        if (r == 0)
            r = vf_buf_append(b, params[i].text, params[i].len);
        if (r == 0 && params[i].name_len == params[i].len)
            r = vf_buf_append_u8(b, '=');
    }
    free(params);
    return r;
}

static int cmp_header(const void *pa, const void *pb)
{
    const vf_sigv4_header *a = *(const vf_sigv4_header *const *)pa, *b = *(const vf_sigv4_header *const *)pb;
    return strcmp(a->name, b->name);
}

int vf_sigv4_sign(const vf_sigv4_request *req, char **authorization, char **canonical_request,
                  char **string_to_sign)
{
    *authorization = NULL;
    if (canonical_request)
        *canonical_request = NULL;
    if (string_to_sign)
        *string_to_sign = NULL;
    if (!req->amz_date || strlen(req->amz_date) != 16 || req->amz_date[8] != 'T')
        return vf_error(VF_EINVAL, "SigV4: bad x-amz-date '%s' (want YYYYMMDDTHHMMSSZ)",
                        req->amz_date ? req->amz_date : "(null)");
    if (!req->num_headers || req->num_headers > 64)
        return vf_error(VF_EINVAL, "SigV4: %zu signed headers (1..64)", req->num_headers);
    const vf_sigv4_header *sorted[64];
    for (size_t i = 0; i < req->num_headers; i++)
        sorted[i] = &req->headers[i];
    qsort(sorted, req->num_headers, sizeof sorted[0], cmp_header);

    vf_buf creq = {0}, signed_names = {0}, sts = {0};
    int r = vf_buf_printf(&creq, "%s\n%s\n", req->method, req->canonical_uri);
    if (r == 0)
        r = canonical_query(&creq, req->query);
    if (r == 0)
        r = vf_buf_append_u8(&creq, '\n');
    for (size_t i = 0; i < req->num_headers && r == 0; i++) {
        r = vf_buf_printf(&creq, "%s:%s\n", sorted[i]->name, sorted[i]->value);
        if (r == 0)
            r = vf_buf_printf(&signed_names, "%s%s", i ? ";" : "", sorted[i]->name);
    }
    if (r == 0)
        r = vf_buf_printf(&creq, "\n%s\n%s", (char *)signed_names.data, req->payload_hash);

    char date[9];
    memcpy(date, req->amz_date, 8);
    date[8] = '\0';
    char creq_hash[65];
    if (r == 0) {
        vf_sha256_hex(creq.data, creq.len, creq_hash);
        r = vf_buf_printf(&sts, "AWS4-HMAC-SHA256\n%s\n%s/%s/%s/aws4_request\n%s", req->amz_date, date, req->region,
                          req->service, creq_hash);
    }

    uint8_t key[32];
    if (r == 0) {
        char *secret = vf_asprintf("AWS4%s", req->secret_key);
        if (!secret)
            r = VF_ENOMEM;
        else {
            r = hmac_sha256(secret, strlen(secret), date, key);
            memset(secret, 0, strlen(secret));
            free(secret);
        }
    }
    if (r == 0)
        r = hmac_sha256(key, 32, req->region, key);
    if (r == 0)
        r = hmac_sha256(key, 32, req->service, key);
    if (r == 0)
        r = hmac_sha256(key, 32, "aws4_request", key);
    uint8_t sig[32];
    char sig_hex[65];
    if (r == 0 && (r = hmac_sha256(key, 32, (const char *)sts.data, sig)) == 0) {
        to_hex(sig, 32, sig_hex);
        *authorization = vf_asprintf("AWS4-HMAC-SHA256 Credential=%s/%s/%s/%s/aws4_request, SignedHeaders=%s, "
                                     "Signature=%s",
                                     req->access_key, date, req->region, req->service, (char *)signed_names.data,
                                     sig_hex);
        if (!*authorization)
            r = VF_ENOMEM;
    }
    memset(key, 0, sizeof key);
    if (r == 0 && canonical_request && !(*canonical_request = vf_buf_take_string(&creq)))
        r = VF_ENOMEM;
    if (r == 0 && string_to_sign && !(*string_to_sign = vf_buf_take_string(&sts)))
        r = VF_ENOMEM;
    vf_buf_free(&creq);
    vf_buf_free(&signed_names);
    vf_buf_free(&sts);
    if (r < 0) {
        free(*authorization);
        *authorization = NULL;
        if (canonical_request) {
            free(*canonical_request);
            *canonical_request = NULL;
        }
    }
    return r;
}
