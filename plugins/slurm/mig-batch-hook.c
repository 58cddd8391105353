/*
 * mig_batch hook client in C: what mig_batch/node/hook_client.py does, without an interpreter's start.
 * `mig-batch slurm install` compiles it when the host has a C compiler; every job runs it twice
 * (Prolog and Epilog), so its start is what a site plugin pays per job.
 *
 *     mig-batch-hook prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...
 *
 * Built with its paths compiled in (HOOK_SOCKET, HOOK_CONFIG, HOOK_PYTHON, HOOK_JOB_DIR), it is also the
 * Prolog, Epilog and TaskProlog themselves: run with no arguments, the word in its name says which
 * (see hook_of); `mig-batch-hook settings` prints those paths.
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

/* Ask the agent; log its answer, or run the slow path (when given) if it does not answer. */
static void hook(const char *op, const char *job, const char *path, char **slow)
{
	static char answer[ANSWER_MAX];
	char ident[32];

	snprintf(ident, sizeof(ident), "mig-batch-%s", op);
	openlog(ident, LOG_PID, LOG_DAEMON);
	signal(SIGPIPE, SIG_IGN);
	if (!safe_job_id(job)) {
		syslog(LOG_WARNING, "job id '%.64s' is not a Slurm job id; nothing asked", job);
		return;
	}
	if (ask(path, op, job, answer, sizeof(answer)) == 0) {
		int trouble = !strstr(answer, "\"ok\": true") || strstr(answer, "node=requeue:");
		syslog(trouble ? LOG_WARNING : LOG_INFO, "job %s: %s", job, answer);
		return;
	}
	syslog(LOG_WARNING, "job %s: node agent unreachable at %s (%s); slow path", job, path, answer);
	if (slow && slow[0])
		slow_path(job, slow);
}

#if defined(HOOK_SOCKET) && defined(HOOK_CONFIG) && defined(HOOK_PYTHON) && defined(HOOK_JOB_DIR)
/*
 * Installed as the hooks themselves (`mig-batch slurm install --hook-client direct`, which compiles these
 * paths in): Slurm runs mig-batch-prolog, mig-batch-epilog or mig-batch-taskprolog with no arguments, and
 * the name says which. No shell starts: each job saves three.
 */

/* The Prolog or Epilog. The work runs in a child: however it ends (a crash included), this process exits 0,
 * since a failing Prolog drains the node; a child that did not end normally hands over to the slow path. */
static int installed_hook(const char *op)
{
	const char *job = getenv("SLURM_JOB_ID");
	/* -I: root's Python takes nothing from the working directory or the PYTHON* variables */
	char *slow[] = {HOOK_PYTHON, "-I", "-m", "mig_batch.slurm.hooks", (char *)op, NULL};
	int status = 0;

	job = job ? job : "";
	setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin", 1);
	setenv("MIG_BATCH_CONFIG", HOOK_CONFIG, 1);
	pid_t child = fork();
	if (child == 0) {
		hook(op, job, HOOK_SOCKET, slow);
		_exit(0);
	}
	if (child < 0) { /* no process to spare: the work here */
		hook(op, job, HOOK_SOCKET, slow);
		return 0;
	}
	while (waitpid(child, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		char ident[32];
		snprintf(ident, sizeof(ident), "mig-batch-%s", op);
		openlog(ident, LOG_PID, LOG_DAEMON);
		syslog(LOG_ERR, "job %s: the hook client ended abnormally (wait status %d); slow path", job, status);
		if (safe_job_id(job))
			slow_path(job, slow);
	}
	return 0;
}

/* The TaskProlog: the job's file's common lines, then those of this task's rank (`#rank R export ...`, R
 * from SLURM_LOCALID, 0 without it), as the shell TaskProlog prints them; no file: NoDevFiles for a MIG job. */
static int task_prolog(void)
{
	const char *job = getenv("SLURM_JOB_ID"), *rank = getenv("SLURM_LOCALID");
	char path[4096], prefix[64];
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int pass, has_rank = 1;

	if (!job || !safe_job_id(job))
		return 0;
	rank = rank && *rank ? rank : "0";
	for (const char *c = rank; *c; c++)
		has_rank = has_rank && *c >= '0' && *c <= '9';
	has_rank = has_rank && strlen(rank) < 20;
	snprintf(prefix, sizeof(prefix), "#rank %s ", has_rank ? rank : "");
	snprintf(path, sizeof(path), "%s/%s", HOOK_JOB_DIR, job);
	FILE *f = fopen(path, "r");
	if (!f) { /* a MIG job without its file (job_submit.lua marks it): no GPU rather than every one */
		const char *mig = getenv("MIG_BATCH_JOB");
		if (mig && *mig)
			printf("export CUDA_VISIBLE_DEVICES=NoDevFiles\n");
		return 0;
	}
	for (pass = 0; pass < 1 + has_rank; pass++) {
		rewind(f);
		while ((len = getline(&line, &cap, f)) > 0) {
			if (line[len - 1] == '\n')
				line[--len] = '\0';
			if (pass == 0 && strncmp(line, "#rank ", 6) != 0)
				printf("%s\n", line);
			else if (pass == 1 && strncmp(line, prefix, strlen(prefix)) == 0)
				printf("%s\n", line + strlen(prefix));
		}
	}
	free(line);
	fclose(f);
	return 0;
}

/* Which hook a name is ("taskprolog", "prolog", "epilog"; NULL for none): the name holds the word, so a
 * link such as prolog.d/50-mig-prolog works too. Slurm's other hooks are never taken for ours. */
static const char *hook_of(const char *given)
{
	char name[256];
	size_t i;
	for (i = 0; given[i] && i < sizeof(name) - 1; i++)
		name[i] = (given[i] >= 'A' && given[i] <= 'Z') ? given[i] - 'A' + 'a' : given[i];
	name[i] = '\0';
	if (strstr(name, "slurmctld") || strstr(name, "taskepilog") || strstr(name, "srun"))
		return NULL;
	if (strstr(name, "taskprolog"))
		return "taskprolog";
	if (strstr(name, "epilog"))
		return "epilog";
	if (strstr(name, "prolog"))
		return "prolog";
	return NULL;
}
#endif

int main(int argc, char **argv)
{
#if defined(HOOK_SOCKET) && defined(HOOK_CONFIG) && defined(HOOK_PYTHON) && defined(HOOK_JOB_DIR)
	const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	const char *which = hook_of(name);
	if (argc == 1 && which && strcmp(which, "taskprolog") == 0)
		return task_prolog();
	if (argc == 1 && which)
		return installed_hook(which);
	if (argc == 1 && strcmp(name, "mig-batch-hook") != 0) { /* a hook under a name that says not which */
		openlog("mig-batch-hook", LOG_PID, LOG_DAEMON);
		syslog(LOG_ERR, "run as '%.200s' with no arguments: as a Slurm hook, its name must hold prolog, epilog "
		       "or taskprolog (the hook it is); nothing done", name);
	}
	if (argc == 2 && strcmp(argv[1], "settings") == 0) { /* for `mig-batch doctor` and the curious */
		printf("socket=%s\nconfig=%s\npython=%s\njob_dir=%s\n", HOOK_SOCKET, HOOK_CONFIG, HOOK_PYTHON,
		       HOOK_JOB_DIR);
		return 0;
	}
#endif
	if (argc < 4 || (strcmp(argv[1], "prolog") != 0 && strcmp(argv[1], "epilog") != 0)) {
		fputs("usage: mig-batch-hook prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...\n", stderr);
		return 0;
	}
	hook(argv[1], argv[2], argv[3], argv + 4);
	return 0;
}
