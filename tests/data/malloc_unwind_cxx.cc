// kheap malloc test workload (tests/host_only/malloc_unwind.rs): the standard
// containers grow through libstdc++ and template code, both built without
// frame pointers (g++ -O2); the allocations must be attributed to the
// functions below, which grow them.
#include <cstdio>
#include <unistd.h>
#include <string>
#include <vector>

// Filled in by other functions, out of line: the compiler may not drop
// the allocations.
__attribute__((noipa)) void consume(const std::string &s, size_t *n)
{
	*n += s.size();
}

// 10 vectors grown to 1000 ints with push_back and no reserve: capacity
// doubles from 1 to 1024, 11 allocations of 4, 8, ..., 4096 bytes each.
__attribute__((noipa)) size_t grow_vectors()
{
	size_t n = 0;
	for (int k = 0; k < 10; k++) {
		std::vector<int> v;
		for (int i = 0; i < 1000; i++)
			v.push_back(i);
		n += v.size();
	}
	return n;
}

// 500 strings of 40 characters, past the 15 that fit in the string itself:
// one allocation of 41 bytes each.
__attribute__((noipa)) size_t build_strings()
{
	size_t n = 0;
	for (int i = 0; i < 500; i++) {
		std::string s(40, (char)('a' + i % 26));
		consume(s, &n);
	}
	return n;
}

int main()
{
	size_t a = grow_vectors();
	size_t b = build_strings();
	std::printf("%zu %zu\n", a, b);
	/* Stay a second: kheap unwinds a copy with /proc/PID/maps while the
	 * process lives. A process that exits before kheap has drained its
	 * copies (--exact-stacks under qemu TCG) is unwound with the mappings
	 * the BPF side recorded, which can miss files; lost.unwind_no_mappings
	 * counts those (docs/design.md). This test checks attribution, not
	 * that race. */
	sleep(1);
	return 0;
}
