/**
 * The gateway's own binaries, run as a user runs them: `gateway start` as a child process (waiting for its
 * "gateway started" log line, which carries the bound addresses), and the CLIs with a controlled environment
 * and standard input.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const BIN = (name: 'gateway' | 'gwctl' | 'gwsh' | 'gateway-upgrade') => fileURLToPath(new URL(`../../dist/cli/${name}.js`, import.meta.url));

export interface RunResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a CLI with exactly the variables given (plus PATH), so a developer's own proxy settings cannot leak in. */
export function runCli(
  name: 'gateway' | 'gwctl' | 'gwsh' | 'gateway-upgrade',
  args: string[],
  options: { env?: Record<string, string>; input?: string; timeoutMs?: number; wrap?: string[]; cwd?: string } = {},
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    // wrap: a command the CLI runs under (e.g. unshare); it must exec the rest of its arguments.
    const [command, ...rest] = [...(options.wrap ?? []), process.execPath, BIN(name), ...args];
    const child = spawn(command!, rest, {
      env: { PATH: process.env.PATH ?? '', ...(options.env ?? {}) },
      ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${name} ${args.join(' ')} did not finish in ${options.timeoutMs ?? 60_000} ms\n${stderr}`));
    }, options.timeoutMs ?? 60_000);
    child.once('error', reject);
    child.once('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
    // A CLI may exit before it read all its input (a refusal of what it read first): not the test's error.
    child.stdin.on('error', () => undefined);
    child.stdin.end(options.input ?? '');
  });
}

/**
 * Runs a client program a user would run (psql, mariadb, redis-cli, curl) with exactly the variables given (plus
 * PATH), stdin closed. A program still running after timeoutMs is killed and answers status null, so a test sees
 * a hang as a failed run rather than waiting on it.
 */
export function runProgram(command: string, args: string[], options: { env?: Record<string, string>; timeoutMs?: number } = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env: { PATH: process.env.PATH ?? '', ...(options.env ?? {}) }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 30_000);
    child.once('error', reject);
    child.once('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

export interface RunningGateway {
  dir: string;
  dataDir: string;
  configPath: string;
  /** Bound addresses from the "gateway started" line: auth, web. */
  addresses: Record<string, string>;
  hostId?: string;
  logs(): string;
  /** Resolves with the first log line containing text (output arrives asynchronously). */
  waitForLog(text: string, timeoutMs?: number): Promise<string>;
  /** SIGTERM and wait; resolves with the exit code. */
  stop(): Promise<number | null>;
  process: ChildProcess;
}

/**
 * Writes configYaml (with DATA_DIR replaced by a fresh data directory) and runs `gateway start -c` with args.
 * Resolves once it logs "gateway started"; rejects with its output if it exits first.
 */
export async function startGateway(
  configYaml: string,
  options: {
    args?: string[];
    env?: Record<string, string>;
    dataDir?: string;
    timeoutMs?: number;
    /** Starts it under `ulimit -n` of this many descriptors (sh execs node, so the pid is the daemon's). */
    openFiles?: number;
    /** Another build's gateway.js (default: this tree's dist/cli/gateway.js), e.g. one that says another version. */
    bin?: string;
    /** Options of node itself before the script, e.g. --cpu-prof (which NODE_OPTIONS may not carry). */
    nodeArgs?: string[];
  } = {},
): Promise<RunningGateway> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-daemon-'));
  const dataDir = options.dataDir ?? join(dir, 'data');
  const configPath = join(dir, 'gateway.yaml');
  await writeFile(configPath, configYaml.replaceAll('DATA_DIR', dataDir));
  const argv = [process.execPath, ...(options.nodeArgs ?? []), options.bin ?? BIN('gateway'), 'start', '-c', configPath, ...(options.args ?? [])];
  const [command, ...args] = options.openFiles === undefined ? argv : ['sh', '-c', `ulimit -n ${options.openFiles} && exec "$@"`, 'sh', ...argv];
  const child = spawn(command!, args, {
    env: { PATH: process.env.PATH ?? '', ...(options.env ?? {}) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  const started = await new Promise<{ addresses: Record<string, string>; host_id?: string }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`gateway did not start in time:\n${output}`)), options.timeoutMs ?? 30_000);
    const check = () => {
      const line = output.split('\n').find((l) => l.includes('"gateway started"'));
      if (line) {
        clearTimeout(timer);
        resolve(JSON.parse(line) as { addresses: Record<string, string>; host_id?: string });
      }
    };
    child.stderr.on('data', check);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(Object.assign(new Error(`gateway exited with ${code}:\n${output}`), { output, code }));
    });
  });
  // A daemon that exits before stop() says so with the end of its output, so that a test failing after it (a
  // closed connection, a resource no longer known) shows why in the CI log.
  let stopping = false;
  child.once('exit', (code, signal) => {
    if (!stopping) process.stderr.write(`startGateway: the daemon exited before stop() (code ${code}, signal ${signal}); its last output:\n${output.slice(-4096)}\n`);
  });
  return {
    dir,
    dataDir,
    configPath,
    addresses: started.addresses,
    ...(started.host_id ? { hostId: started.host_id } : {}),
    logs: () => output,
    waitForLog: (text, timeoutMs = 10_000) =>
      new Promise<string>((resolve, reject) => {
        const deadline = Date.now() + timeoutMs;
        const check = () => {
          const line = output.split('\n').find((l) => l.includes(text));
          if (line) return resolve(line);
          if (Date.now() > deadline) return reject(new Error(`no log line with ${JSON.stringify(text)} within ${timeoutMs} ms`));
          setTimeout(check, 50);
        };
        check();
      }),
    process: child,
    async stop() {
      if (child.exitCode !== null) return child.exitCode;
      stopping = true;
      const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      const code = await exited;
      await rm(dir, { recursive: true, force: true });
      return code;
    },
  };
}

/** Runs `gateway start` expecting it to fail; resolves with its output and exit code. */
export async function startGatewayExpectingFailure(configYaml: string, args: string[], env: Record<string, string> = {}): Promise<RunResult & { dataDir: string }> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-daemon-'));
  const dataDir = join(dir, 'data');
  const configPath = join(dir, 'gateway.yaml');
  await writeFile(configPath, configYaml.replaceAll('DATA_DIR', dataDir));
  const result = await runCli('gateway', ['start', '-c', configPath, ...args], { env, timeoutMs: 30_000 });
  return { ...result, dataDir };
}
