/* kheap malloc test allocator (tests/host_only/malloc_langs.rs). It stands for
 * jemalloc configured with --with-jemalloc-prefix=je_, which Debian does not
 * ship: it exports the prefixed names only (je_malloc, je_calloc, je_free)
 * and serves them from the C library's malloc, as a wrapper would. Built
 * as a shared library, and as an object linked into the program. */
#include <stdlib.h>
void *je_malloc(size_t n) { return malloc(n); }
void *je_calloc(size_t n, size_t size) { return calloc(n, size); }
void je_free(void *p) { free(p); }
