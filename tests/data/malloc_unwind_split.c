// kheap malloc test workload (tests/host_only/malloc_unwind.rs): built with -O2
// -fomit-frame-pointer. One call site (malloc in make_block) is reached
// along two stacks, 3000 calls through from_a and 2000 through from_b,
// which a frame-pointer walk cannot tell apart (it stops before
// make_block's caller): only the stacks unwound from .eh_frame separate
// them. noipa keeps each function out of line and under its own name.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *volatile keep;

__attribute__((noipa)) void make_block(int i)
{
	char *p = malloc(64);
	p[0] = (char)i;
	keep = p;
	free(p);
}

__attribute__((noipa)) int from_a(int n)
{
	volatile int pad = 1;
	for (int i = 0; i < n; i++)
		make_block(i + pad);
	return n + pad;
}

__attribute__((noipa)) int from_b(int n)
{
	volatile int pad = 2;
	for (int i = 0; i < n; i++)
		make_block(i + pad);
	return n + pad;
}

int main(void)
{
	int sum = 0;

	for (int k = 0; k < 50; k++)
		sum += from_a(60) + from_b(40);
	printf("%d\n", sum);
	/* kheap unwinds copies with /proc/PID/maps while the process lives
	 * (see malloc_unwind_cxx.cc). */
	sleep(1);
	return 0;
}
