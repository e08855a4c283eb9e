// Counts the OpenMP parallel regions a process opens (libgomp's GOMP_parallel), for docs/PERF.md's
// regions per step (issue #34):
//   gcc -O2 -shared -fPIC bench/gomp_count.c -o /tmp/gomp_count.so -ldl
//   GOMP_SPINCOUNT=2000 LD_PRELOAD=/tmp/gomp_count.so ./build/tessera bench ... --steps S
// The difference between two step counts over their difference is the regions per step.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
static long n_parallel = 0;
typedef void (*gp_t)(void (*)(void*), void*, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  static gp_t real = 0;
  if (!real) real = (gp_t)dlsym(RTLD_NEXT, "GOMP_parallel");
  __atomic_add_fetch(&n_parallel, 1, __ATOMIC_RELAXED);
  real(fn, data, num_threads, flags);
}
__attribute__((destructor)) static void report(void) { fprintf(stderr, "GOMP_parallel calls: %ld\n", n_parallel); }
