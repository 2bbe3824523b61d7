/**
 * A test host in its own network namespace, joined to this one by a veth pair: the closest thing to "another
 * machine" a single box offers. Its address is not loopback, so the gateway's rule "loopback targets are never
 * proxied" does not apply and NO_PROXY IP / CIDR entries can be tested for real. Needs root: tests that use it
 * are skipped for other users (test/helpers/root.ts).
 *
 * Addresses come from 198.18.0.0/15 (RFC 2544, set aside for benchmarking test networks), one /30 per host:
 * .1 on this side, .2 inside the namespace. createTestHost6() makes an IPv6-only one instead: a random /64 of
 * fd00::/8 (unique local addresses), ::1 on this side and ::2 inside, no IPv4 address in the namespace at all
 * (127.0.0.1 is taken off its loopback too). Traffic never leaves the machine.
 *
 * drop() cuts the host off silently: an nftables rule set in the namespace drops every packet in and out (no
 * FIN, no RST, no ICMP: the connections through it go quiet), and undrop() deletes it again.
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
  /** The namespace drops every packet in and out (nftables), until undrop(). */
  drop(): void;
  undrop(): void;
  /** The namespace's end of the link (its interface name). */
  link: string;
  /** Runs a command inside the namespace to completion: its stdout; throws with its stderr when it fails. */
  run(command: string, args: string[], input?: string): string;
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

const DROP_TABLE = 'gwtestdrop';
const DROP_RULES = `table inet ${DROP_TABLE} {
  chain in { type filter hook input priority 0; policy drop; }
  chain out { type filter hook output priority 0; policy drop; }
}
`;

export async function createTestHost(): Promise<TestHost> {
  const block = randomInt(0, 1 << 15); // one /30 out of 198.18.0.0/15
  const base = (198 << 24) + (18 << 16) + block * 4;
  const dotted = (n: number) => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
  return makeHost(4, dotted(base + 1), dotted(base + 2), block.toString(36));
}

/** An IPv6-only test host: ::1 of a random fd00::/8 /64 on this side, ::2 inside. */
export async function createTestHost6(): Promise<TestHost> {
  const hex = () => randomInt(0, 1 << 16).toString(16);
  const prefix = `fd${randomInt(0, 256).toString(16).padStart(2, '0')}:${hex()}:${hex()}:${hex()}`;
  return makeHost(6, `${prefix}::1`, `${prefix}::2`, `6${hex()}`);
}

async function makeHost(family: 4 | 6, localIp: string, hostIp: string, id: string): Promise<TestHost> {
  const len = family === 4 ? 30 : 64;
  const tag = `${id}${randomInt(0, 36 ** 3).toString(36)}`;
  const ns = `gwtest-${tag}`;
  const outer = `gwo${tag}`.slice(0, 15);
  const inner = `gwi${tag}`.slice(0, 15);
  const children: ChildProcess[] = [];

  ip(['netns', 'add', ns]);
  try {
    ip(['link', 'add', outer, 'type', 'veth', 'peer', 'name', inner, 'netns', ns]);
    // nodad: an IPv6 address is usable at once, not after duplicate address detection (a second or two).
    const v6 = family === 6 ? ['nodad'] : [];
    ip(['addr', 'add', `${localIp}/${len}`, 'dev', outer, ...v6]);
    ip(['link', 'set', outer, 'up']);
    ip(['-n', ns, 'addr', 'add', `${hostIp}/${len}`, 'dev', inner, ...v6]);
    ip(['-n', ns, 'link', 'set', inner, 'up']);
    ip(['-n', ns, 'link', 'set', 'lo', 'up']);
    if (family === 6) ip(['-n', ns, 'addr', 'del', '127.0.0.1/8', 'dev', 'lo']);
  } catch (err) {
    spawnSync('ip', ['netns', 'del', ns]);
    throw err;
  }

  const run = (command: string, args: string[], input?: string) => {
    const r = spawnSync('ip', ['netns', 'exec', ns, command, ...args], { encoding: 'utf8', ...(input === undefined ? {} : { input }) });
    if (r.status !== 0) throw new Error(`${command} ${args.join(' ')} in ${ns} failed: ${r.stderr.trim()}`);
    return r.stdout;
  };
  const host: TestHost = {
    ns,
    localIp,
    ip: hostIp,
    link: inner,
    run,
    drop: () => void run('nft', ['-f', '-'], DROP_RULES),
    undrop: () => void run('nft', ['delete', 'table', 'inet', DROP_TABLE]),
    spawn(command, args) {
      const child = spawn('ip', ['netns', 'exec', ns, command, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
      children.push(child);
      return child;
    },
    async startEcho(port = 7000) {
      host.spawn('socat', [`TCP${family}-LISTEN:${port},bind=${family === 6 ? `[${hostIp}]` : hostIp},fork,reuseaddr`, 'PIPE']);
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
