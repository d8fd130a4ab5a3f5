/* kheap malloc test workload (tests/kernel_dependent/malloc.rs): the parent allocates (so
 * kheap's sites are hot, and on Linux 6.18 optimized) before it forks; the
 * child allocates too. Exits with the child's status, or 100 + its signal. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

void *volatile sink;

__attribute__((noinline)) void parent_work(void)
{
	for (int i = 0; i < 10; i++)
		sink = malloc(32);
}

__attribute__((noinline)) void child_work(void)
{
	for (int i = 0; i < 20; i++)
		sink = malloc(48);
}

int main(void)
{
	int status;
	pid_t pid;

	parent_work();
	pid = fork();
	if (pid == 0) {
		child_work();
		_exit(0);
	}
	if (waitpid(pid, &status, 0) != pid)
		return 99;
	return WIFSIGNALED(status) ? 100 + WTERMSIG(status)
				   : WEXITSTATUS(status);
}
