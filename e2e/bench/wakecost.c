// wakecost.c: what waking a sleeping thread on another CPU costs the thread
// that wakes it, on this host. Thread A (CPU 1) writes an eventfd that
// thread B (CPU 0) reads, timing only A's write(2), then spins until B has
// the value, so A itself never sleeps:
//   mode 0: B blocks in read(2); its CPU idles, and each write must wake it
//           (try_to_wake_up and, for an idle CPU, an interrupt);
//   mode 1: B polls the non-blocking eventfd; no write has anyone to wake.
// The difference is the waker's cost of one wake-up. A sleeps 50 µs before
// each write, so B's CPU has gone idle by then. Bounded: 20,000 writes.
//
//   gcc -O2 -pthread -o /tmp/wakecost e2e/bench/wakecost.c
//   /tmp/wakecost 0; /tmp/wakecost 1
//
// Used in results/2026-12-05-issue18-remaining.md.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

enum { WRITES = 20000 };
static int efd, polling;
static atomic_int seen;

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *reader(void *unused) {
    (void)unused;
    pin(0);
    uint64_t v;
    for (int i = 0; i < WRITES; i++) {
        if (polling) {
            while (read(efd, &v, sizeof v) != sizeof v) {
            }
        } else if (read(efd, &v, sizeof v) != sizeof v) {
            exit(1);
        }
        atomic_store(&seen, i + 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    polling = argc > 1 && atoi(argv[1]) == 1;
    efd = eventfd(0, polling ? EFD_NONBLOCK : 0);
    if (efd < 0) return 1;
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);
    pin(1);
    uint64_t one = 1, total = 0;
    for (int i = 0; i < WRITES; i++) {
        usleep(50);
        uint64_t t0 = now_ns();
        if (write(efd, &one, sizeof one) != sizeof one) return 1;
        total += now_ns() - t0;
        while (atomic_load(&seen) != i + 1) {
        }
    }
    pthread_join(t, NULL);
    printf("%s: %.2f µs per write\n", polling ? "reader polling (no wake-up)" : "reader asleep (a wake-up per write)",
           (double)total / 1000.0 / WRITES);
    return 0;
}
