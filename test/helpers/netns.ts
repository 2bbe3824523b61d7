/**
 * A test host in its own network namespace, joined to this one by a veth pair: the closest thing to "another
 * machine" a single box offers. Its address is not loopback, so the gateway's rule "loopback targets are never
 * proxied" does not apply and NO_PROXY IP / CIDR entries can be tested for real. Needs root: tests that use it
 * are skipped for other users (test/helpers/root.ts).
 *
 * Addresses come from 198.18.0.0/15 (RFC 2544, set aside for benchmarking test networks), one /30 per host:
 * .1 on this side, .2 inside the namespace. Traffic never leaves the machine.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { randomInt } from 'node:crypto';

export interface TestHost {
  /** Namespace name (ip netns). */
  ns: string;
  /** Address of this side of the link (where the namespace reaches us). */
  localIp: string;
  /** Address of the test host inside the namespace. */
  ip: string;
  /** Starts a long-running command inside the namespace; it is killed by close(). */
  spawn(command: string, args: string[]): ChildProcess;
  /** A TCP echo server (socat) inside the namespace; half-close is passed back. Resolves once it accepts. */
  startEcho(port?: number): Promise<number>;
  close(): Promise<void>;
}

function ip(args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')} failed: ${r.stderr.trim()}`);
}

export async function waitForPort(host: string, port: number, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.connect({ host, port });
      s.once('connect', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing listens on ${host}:${port} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function createTestHost(): Promise<TestHost> {
  const block = randomInt(0, 1 << 15); // one /30 out of 198.18.0.0/15
  const base = (198 << 24) + (18 << 16) + block * 4;
  const dotted = (n: number) => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
  const localIp = dotted(base + 1);
  const hostIp = dotted(base + 2);
  const tag = `${block.toString(36)}${randomInt(0, 36 ** 3).toString(36)}`;
  const ns = `gwtest-${tag}`;
  const outer = `gwo${tag}`.slice(0, 15);
  const inner = `gwi${tag}`.slice(0, 15);
  const children: ChildProcess[] = [];

  ip(['netns', 'add', ns]);
  try {
    ip(['link', 'add', outer, 'type', 'veth', 'peer', 'name', inner, 'netns', ns]);
    ip(['addr', 'add', `${localIp}/30`, 'dev', outer]);
    ip(['link', 'set', outer, 'up']);
    ip(['-n', ns, 'addr', 'add', `${hostIp}/30`, 'dev', inner]);
    ip(['-n', ns, 'link', 'set', inner, 'up']);
    ip(['-n', ns, 'link', 'set', 'lo', 'up']);
  } catch (err) {
    spawnSync('ip', ['netns', 'del', ns]);
    throw err;
  }

  const host: TestHost = {
    ns,
    localIp,
    ip: hostIp,
    spawn(command, args) {
      const child = spawn('ip', ['netns', 'exec', ns, command, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
      children.push(child);
      return child;
    },
    async startEcho(port = 7000) {
      host.spawn('socat', [`TCP-LISTEN:${port},bind=${hostIp},fork,reuseaddr`, 'PIPE']);
      await waitForPort(hostIp, port);
      return port;
    },
    async close() {
      for (const child of children) child.kill('SIGKILL');
      await Promise.all(
        children.map((c) => (c.exitCode !== null || c.signalCode !== null ? undefined : new Promise((r) => c.once('exit', r)))),
      );
      spawnSync('ip', ['link', 'del', outer]);
      spawnSync('ip', ['netns', 'del', ns]);
    },
  };
  return host;
}
