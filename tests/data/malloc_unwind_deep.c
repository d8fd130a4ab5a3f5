// kheap malloc test workload (tests/host_only/malloc_unwind.rs): built with -O2
// -fomit-frame-pointer; malloc is called through six nested functions, so a
// frame-pointer walk cannot get past the first of them. noipa keeps each
// function out of line, unspecialised and under its own name; the work
// after each call keeps the calls from becoming tail jumps.
#include <stdio.h>
#include <stdlib.h>

static void *volatile keep;

__attribute__((noipa)) int level6(int i)
{
	char *p = malloc(48);
	p[0] = (char)i;
	keep = p;
	free(p);
	return i + 6;
}

#define LEVEL(n, next)                                   \
	__attribute__((noipa)) int level##n(int i)       \
	{                                                \
		volatile int pad[4] = {i, i, i, i};      \
		return next(i + pad[n % 4]) * 3 + n;     \
	}

LEVEL(5, level6)
LEVEL(4, level5)
LEVEL(3, level4)
LEVEL(2, level3)
LEVEL(1, level2)

int main(void)
{
	long sum = 0;

	for (int i = 0; i < 100; i++)
		sum += level1(i);
	printf("%ld\n", sum);
	return 0;
}
