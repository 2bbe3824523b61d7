/**
 * Child processes of the upgrader: package managers (argv, no shell) and the operator's configurable commands
 * (version, restart, health: one shell command line each, run with /bin/sh -c). Output is kept (bounded) so a
 * failure can quote its last lines, and optionally echoed to a stream as it comes.
 */
import { spawn } from 'node:child_process';

export interface CommandResult {
  /** Exit status, or null when killed by a signal (including our timeout). */
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  /** The command could not be started at all (ENOENT, EACCES). */
  spawnError?: NodeJS.ErrnoException;
}

export interface RunOptions {
  env?: NodeJS.ProcessEnv;
  timeoutMs?: number;
  /** Echo the child's output here as it arrives (the operator sees apt's progress). */
  echo?: NodeJS.WritableStream;
  cwd?: string;
}

const KEEP = 64 * 1024;

function keepTail(acc: string, chunk: string): string {
  const s = acc + chunk;
  return s.length > KEEP ? s.slice(s.length - KEEP) : s;
}

export function runCommand(argv: readonly string[], options: RunOptions = {}): Promise<CommandResult> {
  return new Promise((resolve) => {
    const [file, ...args] = argv;
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    const child = spawn(file!, args, {
      env: options.env ?? process.env,
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(options.cwd ? { cwd: options.cwd } : {}),
    });
    const timer =
      options.timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            timedOut = true;
            child.kill('SIGKILL');
          }, options.timeoutMs);
    child.stdout.on('data', (c: Buffer) => {
      stdout = keepTail(stdout, c.toString());
      options.echo?.write(c);
    });
    child.stderr.on('data', (c: Buffer) => {
      stderr = keepTail(stderr, c.toString());
      options.echo?.write(c);
    });
    child.once('error', (err: NodeJS.ErrnoException) => {
      if (timer) clearTimeout(timer);
      resolve({ code: null, signal: null, stdout, stderr, timedOut, spawnError: err });
    });
    child.once('close', (code, signal) => {
      if (timer) clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, timedOut });
    });
  });
}

export function runShell(command: string, options: RunOptions = {}): Promise<CommandResult> {
  return runCommand(['/bin/sh', '-c', command], options);
}

/** "exit status 100", "killed by SIGKILL (timed out after 900 s)", "cannot start apt-get: ENOENT". */
export function describeExit(argv0: string, r: CommandResult, timeoutMs?: number): string {
  if (r.spawnError) return `cannot start ${argv0}: ${r.spawnError.code ?? r.spawnError.message}`;
  if (r.timedOut) return `timed out after ${Math.round((timeoutMs ?? 0) / 1000)} s`;
  if (r.signal) return `killed by ${r.signal}`;
  return `exit status ${r.code}`;
}

/** The last n non-empty lines of a command's output, for error messages. */
export function lastLines(r: CommandResult, n = 5): string {
  const lines = `${r.stdout}\n${r.stderr}`
    .split('\n')
    .map((l) => l.replace(/\r/g, '').trimEnd())
    .filter((l) => l.trim() !== '');
  return lines.slice(-n).join(' | ');
}

/** Whether a program is on PATH (or an absolute path that is executable). */
export async function which(program: string, env: NodeJS.ProcessEnv = process.env): Promise<boolean> {
  const r = await runCommand(['/bin/sh', '-c', 'command -v "$0" >/dev/null 2>&1', program], { env, timeoutMs: 5_000 });
  return r.code === 0;
}
