// Known user-space allocations for tests/kernel_dependent/malloc.rs: each do_* function
// calls one member of the malloc family a known number of times with known
// sizes; some blocks are never freed. Built by the tests with
// `cc -O1 -g -fno-omit-frame-pointer -fno-inline`.
//
//   workload          run every do_* once
//   workload wait     print "ready", wait for a line on stdin, then run
//   workload fork     run, and also in a forked child, in a child that
//                     execs this program again ("workload child") and in
//                     two threads
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

// Stores through a volatile pointer keep the compiler from pairing a
// malloc with its free and deleting both.
static void *volatile sink;
static void *volatile leaks[64];
static volatile int nleaks;
// A NULL the compiler cannot see: realloc(NULL, n) would become malloc(n).
static void *volatile null_ptr;

NOINLINE void do_malloc(void) // 10 x 100 bytes, freed
{
	for (int i = 0; i < 10; i++) {
		sink = malloc(100);
		free(sink);
	}
}

NOINLINE void do_free_null(void) // 5 x free(NULL), in a row
{
	for (int i = 0; i < 5; i++)
		free(null_ptr);
}

NOINLINE void do_leak(void) // 3 x 5000 bytes, never freed
{
	for (int i = 0; i < 3; i++)
		leaks[nleaks++] = malloc(5000);
}

NOINLINE void do_calloc(void) // 7 x calloc(10, 100): 1000 bytes each
{
	for (int i = 0; i < 7; i++) {
		sink = calloc(10, 100);
		free(sink);
	}
}

NOINLINE void do_realloc(void) // 200, 400, 800 bytes; the last one kept
{
	void *p = realloc(null_ptr, 200);
	p = realloc(p, 400);
	p = realloc(p, 800);
	leaks[nleaks++] = p;
}

NOINLINE void do_reallocarray(void) // 4 x (10 x 30) = 300 bytes, freed
{
	for (int i = 0; i < 4; i++) {
		sink = reallocarray(null_ptr, 10, 30);
		free(sink);
	}
}

NOINLINE void do_posix_memalign(void) // 256, 256 freed; 2048 kept
{
	void *p;
	for (int i = 0; i < 2; i++) {
		if (posix_memalign(&p, 64, 256) == 0)
			free(p);
	}
	if (posix_memalign(&p, 64, 2048) == 0)
		leaks[nleaks++] = p;
}

NOINLINE void do_aligned_alloc(void) // 5 x 512 bytes, freed
{
	for (int i = 0; i < 5; i++) {
		sink = aligned_alloc(64, 512);
		free(sink);
	}
}

NOINLINE void do_memalign(void) // 6 x 64 bytes, freed
{
	for (int i = 0; i < 6; i++) {
		sink = memalign(32, 64);
		free(sink);
	}
}

NOINLINE void do_valloc(void) // 2 x 3000 bytes, freed
{
	for (int i = 0; i < 2; i++) {
		sink = valloc(3000);
		free(sink);
	}
}

NOINLINE void do_pvalloc(void) // 1 x 100 bytes, freed
{
	sink = pvalloc(100);
	free(sink);
}

NOINLINE void do_child(void) // in the forked child: 4 x 700, freed
{
	for (int i = 0; i < 4; i++) {
		sink = malloc(700);
		free(sink);
	}
}

NOINLINE void do_exec_child(void) // in the exec'd child: 6 x 40, 1 kept
{
	for (int i = 0; i < 6; i++) {
		sink = malloc(40);
		if (i > 0)
			free(sink);
	}
}

NOINLINE void do_before_exec(void) // in the child that execs: 2 x 50, kept
{
	for (int i = 0; i < 2; i++)
		leaks[nleaks++] = malloc(50);
}

NOINLINE void do_thread(void) // in each of two threads: 5 x 300, freed
{
	for (int i = 0; i < 5; i++) {
		sink = malloc(300);
		free(sink);
	}
}

static void *thread_main(void *arg)
{
	do_thread();
	return arg;
}

static void run_all(void)
{
	do_malloc();
	do_free_null();
	do_leak();
	do_calloc();
	do_realloc();
	do_reallocarray();
	do_posix_memalign();
	do_aligned_alloc();
	do_memalign();
	do_valloc();
	do_pvalloc();
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";

	if (strcmp(mode, "child") == 0) {
		do_exec_child();
		return 0;
	}
	if (strcmp(mode, "wait") == 0) {
		char line[16];
		printf("ready\n");
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	if (strcmp(mode, "fork") == 0) {
		pid_t pid = fork();
		if (pid == 0) {
			do_child();
			_exit(0);
		}
		waitpid(pid, NULL, 0);
		pid = fork();
		if (pid == 0) {
			do_before_exec();
			execl("/proc/self/exe", argv[0], "child", (char *)NULL);
			_exit(127);
		}
		waitpid(pid, NULL, 0);
		pthread_t t[2];
		for (int i = 0; i < 2; i++)
			pthread_create(&t[i], NULL, thread_main, NULL);
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
	}
	run_all();
	return 0;
}
