/**
 * An interactive program a test types into (psql, an SSH session through gwsh): send() writes a line, waitFor() waits
 * for text in what it printed (stdout and stderr together), output() all of it, exited its exit code. The child is
 * pushed onto `children` so the test's afterAll stops it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { waitUntil } from './wait.js';

export interface Interactive {
  send(line: string): boolean;
  waitFor(text: string): Promise<void>;
  output(): string;
  exited: Promise<number | null>;
}

export function openInteractive(what: string, command: string, args: string[], env: Record<string, string>, children: ChildProcess[]): Interactive {
  const child = spawn(command, args, { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
  children.push(child);
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (out += c.toString()));
  child.stdin.on('error', () => undefined);
  const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
  return {
    send: (line: string) => child.stdin.write(`${line}\n`),
    waitFor: (text: string) => waitUntil(`${what} prints ${text} (got ${JSON.stringify(out.slice(-300))})`, () => out.includes(text), 30_000),
    output: () => out,
    exited,
  };
}
