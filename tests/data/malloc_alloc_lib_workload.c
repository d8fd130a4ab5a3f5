/* kheap malloc test workload (tests/host_only/malloc_langs.rs), linked against
 * jemalloc or tcmalloc: 123 malloc(77) calls, every third one never freed.
 * Exits with 3 if its blocks did not come from that allocator: both round
 * 77 bytes up to 80, where glibc's malloc gives 88. */
#include <malloc.h>
#include <stdlib.h>
__attribute__((noinline)) void je_work(void) { for (int i = 0; i < 123; i++) { void *p = malloc(77); __asm__ volatile("" :: "r"(p) : "memory"); if (i % 3) free(p); } }
int main(void) { je_work(); void *q = malloc(77); int ours = malloc_usable_size(q) == 80; free(q); return ours ? 0 : 3; }
