/* kheap malloc test workload (tests/malloc_langs.rs), linked against
 * jemalloc or tcmalloc: 123 malloc(77) calls, every third one never freed. */
#include <stdlib.h>
__attribute__((noinline)) void je_work(void) { for (int i = 0; i < 123; i++) { void *p = malloc(77); __asm__ volatile("" :: "r"(p) : "memory"); if (i % 3) free(p); } }
int main(void) { je_work(); return 0; }
