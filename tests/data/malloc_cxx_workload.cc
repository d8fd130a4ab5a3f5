// kheap malloc test workload (tests/host_only/malloc_langs.rs): C++ operator new
// calls with known counts and sizes; leak_some never frees its arrays.
#include <new>
#include <cstdio>
#include <cstdlib>
struct Big { char b[200]; };
struct alignas(64) Al { char b[100]; };
__attribute__((noinline)) void make_arrays() { for (int i = 0; i < 1000; i++) { int *p = new int[50]; asm volatile("" :: "r"(p) : "memory"); delete[] p; } }
__attribute__((noinline)) void make_objects() { for (int i = 0; i < 300; i++) { Big *p = new Big; asm volatile("" :: "r"(p) : "memory"); delete p; } }
__attribute__((noinline)) void make_nothrow() { for (int i = 0; i < 70; i++) { Big *p = new (std::nothrow) Big; asm volatile("" :: "r"(p) : "memory"); delete p; } }
__attribute__((noinline)) void make_aligned() { for (int i = 0; i < 40; i++) { Al *p = new Al; asm volatile("" :: "r"(p) : "memory"); delete p; } }
__attribute__((noinline)) void leak_some() { for (int i = 0; i < 25; i++) { int *p = new int[10]; asm volatile("" :: "r"(p) : "memory"); } }
__attribute__((noinline)) void plain_malloc() { for (int i = 0; i < 11; i++) { void *p = malloc(33); asm volatile("" :: "r"(p) : "memory"); free(p); } }
int main() { make_arrays(); make_objects(); make_nothrow(); make_aligned(); leak_some(); plain_malloc(); return 0; }
