/**
 * curl as the tests run it: `curl -sS --max-time 20` with PATH only in its environment (plus what the test adds,
 * e.g. HTTPS_PROXY), asynchronously by default so that servers in the test's own process keep answering; and an
 * answer as `curl -i` (or `-D -`) prints it, parsed into its status, lower-cased headers and what follows the head.
 */
import { execFile, spawn, spawnSync } from 'node:child_process';
import { promisify } from 'node:util';

const execFileP = promisify(execFile);

/** How a curl run ended: its exit status and what it printed. */
export interface CurlRun {
  status: number | null;
  stdout: string;
  stderr: string;
}

const BASE = ['-sS', '--max-time', '20'];
const envOf = (env: Record<string, string>) => ({ PATH: process.env.PATH ?? '', ...env });

/** `curl -sS --max-time 20 <args>`, without blocking this process; never rejects (the status says how it went). */
export function curl(args: string[], env: Record<string, string> = {}): Promise<CurlRun> {
  return new Promise((resolve) => {
    const child = spawn('curl', [...BASE, ...args], { env: envOf(env) });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

/** The same, blocking (for a peer in another process only: nothing in this one answers while it runs). */
export function curlSync(args: string[], env: Record<string, string> = {}): CurlRun {
  const r = spawnSync('curl', [...BASE, ...args], { encoding: 'utf8', env: envOf(env) });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** An HTTP answer's head as curl prints it: the status, the headers (names lower-cased), and what comes after it. */
export interface CurlHead {
  status: number;
  headers: Record<string, string>;
  /** Everything after the blank line that ends the head (the body with -i; what -w wrote with -D - -o file). */
  rest: string;
}

/** Splits curl's output at the first blank line; with none, all of it is the head. */
export function parseCurlHead(stdout: string): CurlHead {
  const split = stdout.indexOf('\r\n\r\n');
  const head = split === -1 ? stdout : stdout.slice(0, split);
  const [statusLine, ...lines] = head.split('\r\n');
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(':');
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  return { status: Number(statusLine!.split(' ')[1]), headers, rest: split === -1 ? '' : stdout.slice(split + 4) };
}

/** `curl -sS -i --max-time 20 <args>`, parsed; rejects when curl fails (a refused connection, a bad certificate). */
export async function curlHead(args: string[], options: { maxBuffer?: number } = {}): Promise<CurlHead> {
  const { stdout } = await execFileP('curl', [...BASE, '-i', ...args], { encoding: 'utf8', ...options });
  return parseCurlHead(stdout);
}
