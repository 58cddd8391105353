/*
 * mig_batch hook client in C: what mig_batch/node/hook_client.py does, without an interpreter's start.
 * `mig-batch slurm install` compiles it when the host has a C compiler; every job runs it twice
 * (Prolog and Epilog), so its start is what a site plugin pays per job.
 *
 *     mig-batch-hook prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...
 *
 * Asks the node agent over its root-owned Unix socket with one JSON line and logs the answer line to
 * syslog with the job id. When the agent does not answer, it runs SLOW_PATH_COMMAND (the same work
 * in-process, through the package) and says so. Always exits 0: a failing hook drains the node.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#ifndef TIMEOUT_S
#define TIMEOUT_S 120
#endif
#define ANSWER_MAX 65536

/* Slurm's job ids (also 123_4 and 123+1): nothing that could break the hand-written JSON. */
static int safe_job_id(const char *job)
{
	if (!*job || strlen(job) > 64)
		return 0;
	for (const char *c = job; *c; c++) {
		int ok = (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
			 *c == '_' || *c == '+' || *c == '.' || *c == '-';
		if (!ok)
			return 0;
	}
	return 1;
}

/* 0 and the answer line (without its newline; cut at `size`) in `answer`; -1 and the reason in `answer`
 * when the agent did not answer. */
static int ask(const char *path, const char *op, const char *job, char *answer, size_t size)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct timeval timeout = {.tv_sec = TIMEOUT_S};
	char request[512], chunk[4096];
	size_t got = 0;
	int fd, len, complete = 0;

	len = snprintf(request, sizeof(request), "{\"op\": \"%s\", \"job\": \"%s\"}\n", op, job);
	if (len < 0 || (size_t)len >= sizeof(request)) {
		snprintf(answer, size, "job id too long");
		return -1;
	}
	if (strlen(path) >= sizeof(addr.sun_path)) {
		snprintf(answer, size, "socket path too long");
		return -1;
	}
	strcpy(addr.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(answer, size, "socket: %s", strerror(errno));
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
	/* MSG_NOSIGNAL: an agent that went away must lead to the slow path, not kill us with SIGPIPE */
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || send(fd, request, len, MSG_NOSIGNAL) != len) {
		snprintf(answer, size, "%s", strerror(errno));
		close(fd);
		return -1;
	}
	while (!complete) { /* up to the newline; what does not fit in `answer` is read and dropped */
		ssize_t n = read(fd, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(answer, size, "%s", errno == EAGAIN || errno == EWOULDBLOCK ?
				 "no answer within the timeout" : strerror(errno));
			close(fd);
			return -1;
		}
		if (n == 0)
			break;
		complete = chunk[n - 1] == '\n';
		for (ssize_t i = 0; i < n && got < size - 1; i++)
			answer[got++] = chunk[i];
	}
	close(fd);
	if (!complete) { /* it died mid-request */
		snprintf(answer, size, "the agent closed the connection without an answer");
		return -1;
	}
	if (got && answer[got - 1] == '\n')
		got--;
	answer[got] = '\0';
	return 0;
}

static volatile sig_atomic_t timed_out;
static pid_t slow_child;

static void on_alarm(int sig)
{
	(void)sig;
	timed_out = 1;
	if (slow_child > 0)
		kill(slow_child, SIGKILL);
}

/* Run the slow path with its output captured; log its last 500 characters (or its exit status). */
static void slow_path(const char *job, char **argv)
{
	static char out[ANSWER_MAX];
	size_t got = 0;
	int pipefd[2], status = 0;

	if (pipe(pipefd) < 0) {
		syslog(LOG_ERR, "job %s: slow path failed: pipe: %s", job, strerror(errno));
		return;
	}
	slow_child = fork();
	if (slow_child < 0) {
		syslog(LOG_ERR, "job %s: slow path failed: fork: %s", job, strerror(errno));
		return;
	}
	if (slow_child == 0) {
		dup2(pipefd[1], STDOUT_FILENO);
		dup2(pipefd[1], STDERR_FILENO);
		close(pipefd[0]);
		close(pipefd[1]);
		execvp(argv[0], argv);
		fprintf(stderr, "%s: %s", argv[0], strerror(errno));
		_exit(127);
	}
	close(pipefd[1]);
	struct sigaction alarm_action = {.sa_handler = on_alarm}; /* no SA_RESTART: the alarm ends a read */
	sigemptyset(&alarm_action.sa_mask);
	sigaction(SIGALRM, &alarm_action, NULL);
	alarm(TIMEOUT_S);
	while (!timed_out) { /* a grandchild may hold the pipe open after the child is killed */
		ssize_t n = read(pipefd[0], out + got, sizeof(out) - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += n;
		if (got == sizeof(out) - 1) { /* keep the end: drop the first half */
			memmove(out, out + got / 2, got - got / 2);
			got -= got / 2;
		}
	}
	close(pipefd[0]);
	while (waitpid(slow_child, &status, 0) < 0 && errno == EINTR)
		;
	alarm(0);
	slow_child = 0;
	while (got && (out[got - 1] == '\n' || out[got - 1] == ' '))
		got--;
	out[got] = '\0';
	const char *tail = got > 500 ? out + got - 500 : out;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		syslog(LOG_INFO, "job %s (slow path): %s", job, got ? tail : "exit 0");
	else if (WIFEXITED(status))
		syslog(LOG_ERR, "job %s (slow path): %s%sexit %d", job, tail, got ? "; " : "", WEXITSTATUS(status));
	else if (timed_out)
		syslog(LOG_ERR, "job %s: slow path failed: killed after the %d s timeout", job, TIMEOUT_S);
	else
		syslog(LOG_ERR, "job %s: slow path failed: killed by signal %d", job, WTERMSIG(status));
}

int main(int argc, char **argv)
{
	static char answer[ANSWER_MAX];
	char ident[32];

	if (argc < 4 || (strcmp(argv[1], "prolog") != 0 && strcmp(argv[1], "epilog") != 0)) {
		fputs("usage: mig-batch-hook prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...\n", stderr);
		return 0;
	}
	const char *op = argv[1], *job = argv[2], *path = argv[3];
	snprintf(ident, sizeof(ident), "mig-batch-%s", op);
	openlog(ident, LOG_PID, LOG_DAEMON);
	signal(SIGPIPE, SIG_IGN);
	if (!safe_job_id(job)) {
		syslog(LOG_WARNING, "job id '%.64s' is not a Slurm job id; nothing asked", job);
		return 0;
	}
	if (ask(path, op, job, answer, sizeof(answer)) == 0) {
		int trouble = !strstr(answer, "\"ok\": true") || strstr(answer, "node=requeue:");
		syslog(trouble ? LOG_WARNING : LOG_INFO, "job %s: %s", job, answer);
		return 0;
	}
	syslog(LOG_WARNING, "job %s: node agent unreachable at %s (%s); slow path", job, path, answer);
	if (argc > 4)
		slow_path(job, argv + 4);
	return 0;
}
