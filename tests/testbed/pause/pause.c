/* The pod sandbox's process for the real-node test bed (its containerd's sandbox image): it
 * holds the pod's namespaces, reaps orphans and exits on SIGINT or SIGTERM. No registry is
 * reachable here, so the pause image is built from this file (tests/testbed/realnodes.py). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(128 + sig); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction quit = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &quit, NULL);
  sigaction(SIGTERM, &quit, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
  return EXIT_SUCCESS;
}
