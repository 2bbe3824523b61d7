/**
 * Debian's Dante SOCKS server (`danted`, package dante-server), started by a test with its own danted.conf in a
 * temp dir, and stopped by it. Like squid.ts for HTTP CONNECT.
 *
 * - Addresses: danted's `internal:` must be an address of an interface of its network namespace (it refuses
 *   127.0.0.2, which squid can bind), so it listens either in the root namespace on a firewall link's address
 *   (test/helpers/firewall.ts) or inside a test host's namespace (netns.ts), given as `ns`.
 * - Names: `hosts` gives danted a hosts file of its own, so that a test can use names that only the SOCKS server
 *   resolves (what socks5h:// is for): in a namespace through `ip netns exec`'s /etc/netns/<ns>/hosts; in the
 *   root namespace by starting danted in a mount namespace of its own (unshare -m) with the file bind-mounted over
 *   /etc/hosts. Nothing else on the machine sees it.
 * - Users: `socksmethod: username` checks the system's password database (it has no file of its own), so
 *   createSocksUser() adds a throw-away system account (no home, no shell, a random name starting with "gwsk")
 *   with useradd and chpasswd and removes it with userdel; an exit hook removes it if the test never does. That is
 *   the least invasive way Debian's dante offers (its PAM method would need a PAM module that is not installed).
 * - Logs: `log: connect disconnect error` on every rule, so the log shows each session, and with a user
 *   "username%<user>@<client address>".
 * - Stopping: danted relays each session in child processes that outlive a SIGTERM to the main one (sessions in
 *   flight carry on), so danted runs in a process group of its own and stop() ends the whole group: a stop cuts
 *   every session, as a crash of the SOCKS server's host would.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { waitForPort } from './netns.js';

export const DANTED = '/usr/sbin/danted';

export interface DanteOptions {
  /** The address danted listens on (an interface address of its namespace). */
  internal: string;
  port?: number;
  /** The address danted connects out from. Default: internal. */
  external?: string;
  /** Run inside this network namespace (ip netns exec). */
  ns?: string;
  /** Require RFC 1929 username/password (system accounts: createSocksUser). */
  auth?: boolean;
  /** Clients allowed (CIDRs). Default: any. */
  clients?: string[];
  /** hosts-file lines that only danted sees ("198.18.0.2 proxy.gw.test"). */
  hosts?: string;
}

export interface Dante {
  host: string;
  port: number;
  /** socks5h://[user:pass@]host:port (the password percent-encoded). */
  url(scheme?: 'socks5' | 'socks5h', user?: SocksUser): string;
  logPath: string;
  readLog(): Promise<string[]>;
  /** Polls the log until a line matches; rejects after timeoutMs (default 10 s) with the log's tail. */
  waitForLog(predicate: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  stop(): Promise<void>;
}

export interface SocksUser {
  user: string;
  password: string;
  remove(): void;
}

const users = new Set<string>();
const running = new Set<ChildProcess>();
/** Signals danted's whole process group (its pid: spawned detached); false once none of it is left. */
function signalGroup(pid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false;
  }
}

process.once('exit', () => {
  for (const child of running) if (child.pid) signalGroup(child.pid, 'SIGKILL');
  for (const user of users) spawnSync('userdel', [user]);
});

/** A system account for danted's `socksmethod: username`, with a password that needs percent-encoding. */
export function createSocksUser(): SocksUser {
  const user = `gwsk${randomBytes(4).toString('hex')}`;
  const password = `S0cks p@ss:${randomBytes(4).toString('hex')}/%`;
  const add = spawnSync('useradd', ['-M', '-N', '-d', '/nonexistent', '-s', '/usr/sbin/nologin', user], { encoding: 'utf8' });
  if (add.status !== 0) throw new Error(`useradd ${user}: ${add.stderr}`);
  users.add(user);
  const pw = spawnSync('chpasswd', [], { input: `${user}:${password}\n`, encoding: 'utf8' });
  if (pw.status !== 0) throw new Error(`chpasswd ${user}: ${pw.stderr}`);
  return {
    user,
    password,
    remove() {
      if (!users.delete(user)) return;
      spawnSync('userdel', [user]);
    },
  };
}

function conf(o: DanteOptions, port: number, logPath: string): string {
  const clients = o.clients ?? ['0.0.0.0/0'];
  const rule = (kind: string, extra: string[]) =>
    clients.flatMap((from) => [`${kind} pass {`, `  from: ${from} to: 0.0.0.0/0`, ...extra.map((l) => `  ${l}`), '  log: connect disconnect error', '}']);
  return [
    '# generated by test/helpers/dante.ts',
    `logoutput: ${logPath}`,
    `internal: ${o.internal} port = ${port}`,
    `external: ${o.external ?? o.internal}`,
    `socksmethod: ${o.auth ? 'username' : 'none'}`,
    'clientmethod: none',
    'user.privileged: root',
    'user.unprivileged: nobody',
    ...rule('client', []),
    ...rule('socks', ['command: connect']),
    '',
  ].join('\n');
}

export async function startDante(o: DanteOptions): Promise<Dante> {
  const port = o.port ?? 1080;
  const dir = await mkdtemp(join(tmpdir(), 'gw-dante-'));
  const logPath = join(dir, 'danted.log');
  const confPath = join(dir, 'danted.conf');
  await writeFile(confPath, conf(o, port, logPath));
  const args = ['-f', confPath, '-N', '1', '-p', join(dir, 'danted.pid')];
  let command: string[];
  let netnsDir: string | undefined;
  if (o.ns) {
    if (o.hosts !== undefined) {
      netnsDir = `/etc/netns/${o.ns}`;
      mkdirSync(netnsDir, { recursive: true });
      writeFileSync(join(netnsDir, 'hosts'), `${o.hosts}\n`);
    }
    command = ['ip', 'netns', 'exec', o.ns, DANTED, ...args];
  } else if (o.hosts !== undefined) {
    await writeFile(join(dir, 'hosts'), `${o.hosts}\n`, { mode: 0o644 });
    const script = `mount --bind "$1" /etc/hosts && shift && exec "$@"`;
    command = ['unshare', '-m', '--propagation', 'private', 'sh', '-c', script, 'sh', join(dir, 'hosts'), DANTED, ...args];
  } else command = [DANTED, ...args];
  const child = spawn(command[0]!, command.slice(1), { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  running.add(child);
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const readLog = async () => (existsSync(logPath) ? (await readFile(logPath, 'utf8')).split('\n').filter((l) => l.trim() !== '') : []);
  const stop = async () => {
    const pid = child.pid!;
    signalGroup(pid, 'SIGTERM');
    const until = Date.now() + 5000;
    while (signalGroup(pid, 0) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
    signalGroup(pid, 'SIGKILL');
    if (child.exitCode === null && child.signalCode === null) await exited;
    running.delete(child);
    if (netnsDir) rmSync(netnsDir, { recursive: true, force: true });
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await Promise.race([
      waitForPort(o.internal, port, 15_000),
      exited.then(() => {
        throw new Error('danted exited');
      }),
    ]);
  } catch (err) {
    const log = (await readLog()).slice(-20).join('\n');
    await stop();
    throw new Error(`danted did not start: ${(err as Error).message}\n--- log ---\n${log}\n--- stderr ---\n${stderr}`);
  }
  const waitForLog = async (predicate: (line: string) => boolean, timeoutMs = 10_000): Promise<string> => {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const lines = await readLog();
      const hit = lines.find(predicate);
      if (hit !== undefined) return hit;
      if (Date.now() > until) throw new Error(`no matching danted log line within ${timeoutMs} ms; log:\n${lines.slice(-20).join('\n')}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  const hostPart = o.internal.includes(':') ? `[${o.internal}]` : o.internal;
  return {
    host: o.internal,
    port,
    url: (scheme = 'socks5h', user) => `${scheme}://${user ? `${encodeURIComponent(user.user)}:${encodeURIComponent(user.password)}@` : ''}${hostPart}:${port}`,
    logPath,
    readLog,
    waitForLog,
    stop,
  };
}
