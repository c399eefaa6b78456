/* scripts/test-dist-all.sh: bcryptprimitives.dll for wine 8 (Debian 12), which has none.
 * Rust's standard library (1.78+) takes its random bytes from ProcessPrng there, as
 * Windows 10 and later provide it; this one answers from RtlGenRandom (advapi32).
 * Only the test's wine prefix loads it: the SDK never ships it. */
#include <windows.h>
#define SystemFunction036 NTAPI SystemFunction036
#include <ntsecapi.h>
#undef SystemFunction036

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
  while (len > 0) {
    ULONG n = len > 0x10000 ? 0x10000 : (ULONG)len;
    if (!RtlGenRandom(data, n)) return FALSE;
    data += n;
    len -= n;
  }
  return TRUE;
}
