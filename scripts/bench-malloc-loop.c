/* The C workload of scripts/bench-malloc (WORKLOAD=c-fp or c-nofp): N
 * malloc(SIZE)+free pairs from one function called by main, timed, printed
 * as "N pairs, X ns per pair". Built by the script with and without frame
 * pointers: what a probe's stack walk finds above the call differs. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void *volatile sink;

__attribute__((noinline)) static void pair(size_t size)
{
	sink = malloc(size);
	free(sink);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 200000;
	size_t size = argc > 2 ? (size_t)atol(argv[2]) : 64;
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		pair(size);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%ld pairs, %.1f ns per pair\n", n,
	       ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
