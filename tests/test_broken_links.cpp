// A write to the link of a peer that has died must fail, not end the writer: Open MPI 5.0's TCP
// transport leaves SIGPIPE at its default, and survivors of a kill died with it, silently
// (fault.hpp, ignore_broken_links). Each case in a child process, as a rank would be; no MPI.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "fault.hpp"

namespace {

// The child writes to a socket whose other end is closed, as the revoke's broadcast does to a
// rank killed a moment before. Returns the child's wait status.
int write_to_a_closed_peer(bool ignore) {
  const pid_t child = fork();
  if (child == 0) {
    if (ignore) ntp::ignore_broken_links();
    int ends[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, ends) != 0) _exit(10);
    close(ends[1]);
    const char byte = 1;
    const ssize_t n = write(ends[0], &byte, 1);
    _exit(n < 0 && errno == EPIPE ? 0 : 11);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return status;
}

TEST(BrokenLinks, AWriteToADeadPeerFailsWithEpipe) {
  const int status = write_to_a_closed_peer(true);
  ASSERT_TRUE(WIFEXITED(status)) << "the writer died by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The control: without it, the same write ends the process by SIGPIPE, with no message.
TEST(BrokenLinks, WithoutItTheWriterDiesBySigpipe) {
  const int status = write_to_a_closed_peer(false);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGPIPE);
}

}  // namespace
