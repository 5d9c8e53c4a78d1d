#include "interrupt.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "exit_codes.hpp"

namespace ntp {

namespace {

std::atomic<int> g_step{0}, g_rows{0};
char g_results[512];  // the results file's path, fixed before the handler is installed

// Appends `text`, or the decimal digits of `n`, to buf at *len (async-signal-safe).
void put(char* buf, std::size_t& len, std::size_t cap, const char* text) {
  for (; *text && len + 1 < cap; ++text) buf[len++] = *text;
}
void put(char* buf, std::size_t& len, std::size_t cap, int n) {
  char digits[16];
  int k = 0;
  unsigned v = n < 0 ? 0u : static_cast<unsigned>(n);
  do digits[k++] = static_cast<char>('0' + v % 10); while ((v /= 10) && k < 15);
  while (k > 0 && len + 1 < cap) buf[len++] = digits[--k];
}

extern "C" void on_interrupt(int) {
  char line[768];
  std::size_t n = 0;
  put(line, n, sizeof line, "\nntpbench: interrupted at step ");
  put(line, n, sizeof line, g_step.load() + 1);
  put(line, n, sizeof line, ": ");
  put(line, n, sizeof line, g_rows.load());
  put(line, n, sizeof line, " steps saved in ");
  put(line, n, sizeof line, g_results);
  put(line, n, sizeof line, "\n");
  (void)!write(STDERR_FILENO, line, n);
  _exit(code(ExitCode::Interrupted));
}

}  // namespace

void report_interrupts(const std::string& results) {
  std::strncpy(g_results, results.c_str(), sizeof g_results - 1);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void note_progress(int step, int rows) {
  g_step.store(step);
  g_rows.store(rows);
}

}  // namespace ntp
