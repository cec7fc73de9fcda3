// Per-file latency of common syscall sequences inside a directory: best of 5 passes over N files,
// each pass timed as a whole (mean µs per file). Used by scripts/transport-latency/run to compare
// the /dev/fuse and io_uring transports of octofs (docs/transport.md).
// Usage: lat DIR N   (DIR must be empty or absent; it is filled with N files)
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int n;
static char dir[4096];
static char buf[4096];

static void path(char *p, const char *kind, int i) { snprintf(p, 4200, "%s/%s%d", dir, kind, i); }

static double pass_create(int round) {
  char p[4200];
  double t0 = now();
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/c%d-%d", dir, round, i);
    int fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0 || write(fd, buf, 100) != 100 || close(fd) != 0) { perror(p); exit(1); }
  }
  return (now() - t0) / n;
}

static double pass_open_close(void) {
  char p[4200];
  double t0 = now();
  for (int i = 0; i < n; i++) {
    path(p, "f", i);
    int fd = open(p, O_RDONLY);
    if (fd < 0 || close(fd) != 0) { perror(p); exit(1); }
  }
  return (now() - t0) / n;
}

static double pass_open_fstat_read_close(void) {
  char p[4200];
  struct stat st;
  double t0 = now();
  for (int i = 0; i < n; i++) {
    path(p, "f", i);
    int fd = open(p, O_RDONLY);
    if (fd < 0 || fstat(fd, &st) != 0 || read(fd, buf, sizeof buf) < 0 || close(fd) != 0) { perror(p); exit(1); }
  }
  return (now() - t0) / n;
}

static double pass_stat(void) {
  char p[4200];
  struct stat st;
  double t0 = now();
  for (int i = 0; i < n; i++) {
    path(p, "f", i);
    if (stat(p, &st) != 0) { perror(p); exit(1); }
  }
  return (now() - t0) / n;
}

static double best(double (*f)(void)) {
  double b = 1e18;
  for (int r = 0; r < 5; r++) { double x = f(); if (x < b) b = x; }
  return b;
}

int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: lat DIR N\n"); return 2; }
  snprintf(dir, sizeof dir, "%s", argv[1]);
  n = atoi(argv[2]);
  memset(buf, 'x', sizeof buf);
  mkdir(dir, 0755);
  char p[4200];
  for (int i = 0; i < n; i++) {
    path(p, "f", i);
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, buf, 4096) != 4096 || close(fd) != 0) { perror(p); return 1; }
  }
  pass_open_close(); // warm
  double oc = best(pass_open_close);
  double ofrc = best(pass_open_fstat_read_close);
  double st = best(pass_stat);
  double cr = 1e18;
  for (int r = 0; r < 3; r++) { double x = pass_create(r); if (x < cr) cr = x; }
  printf("open+close %.1f\nopen+fstat+read+close %.1f\nstat %.1f\ncreate+write+close %.1f\n", oc, ofrc, st, cr);
  return 0;
}
