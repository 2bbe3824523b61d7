/**
 * `gwsh proxy <app|db|...> <name> --port 0` in its own process, as a user runs it: a local listener in front of a
 * resource, reached through the Proxy. The e2e tests start it for TCP apps, databases and desktops; its port is read
 * from the line it prints once it listens ("... on 127.0.0.1:<port>").
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { BIN } from './gateway.js';

/** A listening `gwsh proxy`: its local port, its process, and everything it printed so far. */
export interface GwshProxy {
  port: number;
  child: ChildProcess;
  output(): string;
}

/**
 * Starts `gwsh proxy <args> --port 0` with PATH and env; resolves once it listens. Rejects, with its output, when it
 * exits first (a refusal, no profile) or does not listen within timeoutMs. The process goes into `children` at once
 * (the test's cleanup kills them), whatever happens next.
 */
export function startGwshProxy(
  args: string[],
  env: Record<string, string>,
  children: ChildProcess[],
  options: { stdin?: 'pipe' | 'ignore'; timeoutMs?: number; wrap?: string[] } = {},
): Promise<GwshProxy> {
  // wrap: a command gwsh runs under (e.g. unshare); it must exec the rest of its arguments.
  const [command, ...rest] = [...(options.wrap ?? []), process.execPath, BIN('gwsh'), 'proxy', ...args, '--port', '0'];
  const child = spawn(command!, rest, { env: { PATH: process.env.PATH ?? '', ...env }, stdio: [options.stdin ?? 'ignore', 'pipe', 'pipe'] });
  children.push(child);
  let out = '';
  let listening = '';
  child.stdout!.on('data', (c: Buffer) => {
    out += c.toString();
    listening += c.toString();
  });
  child.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  const what = `gwsh proxy ${args.join(' ')}`;
  const timeoutMs = options.timeoutMs ?? 30_000;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not listen within ${timeoutMs} ms: ${out}`)), timeoutMs);
    const check = () => {
      const m = /127\.0\.0\.1:(\d+)/.exec(listening);
      if (!m) return;
      clearTimeout(timer);
      child.stdout!.off('data', check);
      resolve({ port: Number(m[1]), child, output: () => out });
    };
    child.stdout!.on('data', check);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code ?? signal}) before listening: ${out}`));
    });
  });
}
