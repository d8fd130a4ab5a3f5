/* kheap malloc test workload (tests/host_only/malloc_langs.rs) for a je_-prefixed
 * allocator: 123 je_malloc(77) calls, every third one never freed. */
#include <stddef.h>
void *je_malloc(size_t n);
void je_free(void *p);
__attribute__((noinline)) void je_work(void) { for (int i = 0; i < 123; i++) { void *p = je_malloc(77); __asm__ volatile("" :: "r"(p) : "memory"); if (i % 3) je_free(p); } }
int main(void) { je_work(); return 0; }
