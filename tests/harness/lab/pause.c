/* The lab's sandbox ("pause") process: wait in pause() until SIGTERM or SIGINT, then exit 0.
 * Built with `gcc -static` by tests/harness/lab/image.py; no libc is needed in the image. */
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_stop(int sig) {
    (void)sig;
    _exit(0);
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
