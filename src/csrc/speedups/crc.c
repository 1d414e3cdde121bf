/* CRC-32 (zlib's crc32, the polynomial of RocketMQ's body CRC) computed in C, for the read path's record checks:
 * calling sluice.format.crc32 per record costs a memoryview, a call and an int besides the CRC itself. On x86-64
 * with PCLMULQDQ the bulk is folded 64 bytes at a time (Intel's "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ Instruction", with the bit-reflected constants of Linux's arch/x86/crypto/crc32-pclmul_asm.S);
 * the tail of under 16 bytes goes through a table. Elsewhere sluice_crc32_native() is 0 and callers use
 * body_crc (common.c) with the Python callable, which has its own vector code (ISA-L). */
#include "speedups.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SLUICE_CLMUL 1
#endif

static uint32_t crc_table[256];
static int crc_state = -1; /* -1 not probed yet, 0 no PCLMULQDQ, 1 folding available */

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
#ifdef SLUICE_CLMUL
    __builtin_cpu_init();
    crc_state = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#else
    crc_state = 0;
#endif
}

/* The running (inverted) CRC state over p[0:n], a byte at a time. */
static uint32_t crc_bytes(uint32_t c, const unsigned char *p, size_t n)
{
    while (n--)
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#ifdef SLUICE_CLMUL
/* The running (inverted) CRC state over buf[0:len], len a multiple of 16 and at least 64. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(const unsigned char *buf, size_t len, uint32_t crc)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;
    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) { /* four lanes folded in parallel */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    x0 = k3k4; /* the four lanes into one */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) { /* the rest, 16 bytes at a time */
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10); /* 128 bits to 64 */
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = poly; /* Barrett reduction to 32 bits */
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

int sluice_crc32_native(void)
{
    if (crc_state < 0)
        crc_init();
    return crc_state;
}

uint32_t sluice_crc32(const unsigned char *p, Py_ssize_t n, int fold)
{
    if (crc_state < 0)
        crc_init();
    uint32_t c = 0xFFFFFFFFu;
    size_t len = (size_t)n;
#ifdef SLUICE_CLMUL
    if (fold && crc_state == 1 && len >= 64) {
        size_t chunk = len & ~(size_t)15;
        c = crc_fold(p, chunk, c);
        p += chunk;
        len -= chunk;
    }
#endif
    return ~crc_bytes(c, p, len);
}
