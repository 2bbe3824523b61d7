/**
 * bench:tunnel's peers and end points, each a real process or server: the counting sink, OpenSSH (sshd and the
 * `ssh -N -R` tunnel through squid, the peer the gateway is measured against) and iperf3 (server and client runs).
 * The gateway's own processes are in bench/tunnel/gateway.ts; squid comes from test/helpers/squid.ts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import getPort from 'get-port';
import type { TestServer } from '../../test/helpers/servers.js';
import type { Squid } from '../../test/helpers/squid.js';
import { waitForPort } from '../../test/helpers/netns.js';
import { exited, sleep, spawnSshd, stopChild, withTimeout } from '../common.js';
import { SSHD_IP, SSHD_NAME, TARGET_IP } from './settings.js';

/** Whether host:port accepts a TCP connection now. */
export function accepts(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

export interface CountingSink extends TestServer {
  /** Resets the count; resolves (hrtime ns) when `bytes` more bytes have arrived over all connections. */
  expect(bytes: number): Promise<bigint>;
}

export async function startCountingSink(host: string): Promise<CountingSink> {
  let got = 0;
  let waiter: { bytes: number; resolve: (t: bigint) => void } | undefined;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => undefined);
    s.on('data', (c: Buffer) => {
      got += c.length;
      if (waiter && got >= waiter.bytes) {
        const w = waiter;
        waiter = undefined;
        w.resolve(process.hrtime.bigint());
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, host, r));
  return {
    host,
    port: (server.address() as net.AddressInfo).port,
    expect: (bytes) => {
      got = 0;
      return new Promise((resolve) => (waiter = { bytes, resolve }));
    },
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

export interface Sshd {
  pid: number;
  port: number;
  process: ChildProcess;
  stop(): Promise<void>;
}



export async function startSshd(dir: string): Promise<Sshd> {
  // sshd refuses to start without its privilege separation directory (the package creates it at boot only).
  if (!existsSync('/run/sshd')) mkdirSync('/run/sshd', { mode: 0o755 });
  const port = await getPort({ host: SSHD_IP });
  const cfg = join(dir, 'sshd_config');
  await writeFile(
    cfg,
    [
      `ListenAddress ${SSHD_IP}:${port}`,
      `HostKey ${join(dir, 'host_key')}`,
      `AuthorizedKeysFile ${join(dir, 'authorized_keys')}`,
      `PidFile ${join(dir, 'sshd.pid')}`,
      'UsePAM no',
      'StrictModes no',
      'AllowTcpForwarding yes',
      // clientspecified: the forward listens on the loopback address ssh -R names (127.0.0.4), not on all addresses.
      'GatewayPorts clientspecified',
      'PermitRootLogin prohibit-password',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'X11Forwarding no',
      'PrintMotd no',
      'UseDNS no',
      '',
    ].join('\n'),
  );
  const child = await spawnSshd(cfg);
  return { pid: child.pid!, port, process: child, stop: () => stopChild(child) };
}

export interface SshTunnel {
  process: ChildProcess;
  /** ms from spawn until both remote forwards were confirmed. */
  readyMs: number;
  stop(): Promise<void>;
}

export async function startSshTunnel(dir: string, squid: Squid, sshd: Sshd, cipher: string, forwards: Array<{ listen: number; to: number }>): Promise<SshTunnel> {
  const args = [
    '-v',
    '-N',
    '-F',
    '/dev/null',
    '-i',
    join(dir, 'user_key'),
    '-o',
    'IdentitiesOnly=yes',
    '-o',
    'BatchMode=yes',
    '-o',
    'StrictHostKeyChecking=no',
    '-o',
    'UserKnownHostsFile=/dev/null',
    '-o',
    'ExitOnForwardFailure=yes',
    '-o',
    `ProxyCommand=socat - PROXY:${squid.host}:%h:%p,proxyport=${squid.port}`,
    '-c',
    cipher,
    '-p',
    String(sshd.port),
    ...forwards.flatMap((f) => ['-R', `${SSHD_IP}:${f.listen}:${TARGET_IP}:${f.to}`]),
    `root@${SSHD_NAME}`,
  ];
  const t0 = process.hrtime.bigint();
  const child = spawn('ssh', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const readyMs = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`ssh -R did not come up:\n${log}`)), 20_000);
    child.once('exit', (code) => reject(new Error(`ssh exited with ${code}:\n${log}`)));
    const onData = (c: Buffer) => {
      log = (log + c.toString()).slice(-20_000);
      const ok = forwards.every((f) => log.includes(`remote forward success for: listen ${SSHD_IP}:${f.listen},`));
      if (ok) {
        clearTimeout(timer);
        resolve(Number(process.hrtime.bigint() - t0) / 1e6);
      }
    };
    child.stderr!.on('data', onData);
  });
  if (!log.includes(`cipher: ${cipher}`)) throw new Error(`ssh did not negotiate ${cipher}:\n${log}`);
  child.stderr!.resume();
  return { process: child, readyMs, stop: () => stopChild(child) };
}

export interface Iperf3Server {
  pid: number;
  port: number;
  stop(): Promise<void>;
}

/** `iperf3 -s` on TARGET_IP (one test at a time; the paths take turns). */
export async function startIperf3Server(): Promise<Iperf3Server> {
  const port = await getPort({ host: TARGET_IP });
  const child = spawn('iperf3', ['-s', '-B', TARGET_IP, '-p', String(port)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr!.on('data', (c: Buffer) => (log = (log + c.toString()).slice(-4000)));
  const up = await Promise.race([waitForPort(TARGET_IP, port).then(() => true), exited(child).then(() => false)]);
  if (!up) throw new Error(`iperf3 -s did not start:\n${log}`);
  return { pid: child.pid!, port, stop: () => stopChild(child) };
}

export interface IperfResult {
  /** sum_received: what the server got, bits per second and bytes. */
  bitsPerSecond: number;
  bytes: number;
}

/**
 * One `iperf3 -c -J` test. A server still finishing the previous test (its connections are closed through the
 * path, which can take a moment) answers "busy": tried again for up to 30 s.
 */
export async function runIperf3(host: string, port: number, streams: number, seconds: number): Promise<IperfResult> {
  for (let i = 0; ; i++) {
    try {
      return await runIperf3Once(host, port, streams, seconds);
    } catch (err) {
      if (!/busy/.test((err as Error).message) || i >= 60) throw err;
      await sleep(500);
    }
  }
}

/** One `iperf3 -c -J` test; rejects with its error or output when it fails. */
export async function runIperf3Once(host: string, port: number, streams: number, seconds: number): Promise<IperfResult> {
  const child = spawn('iperf3', ['-c', host, '-p', String(port), '-J', '-t', String(seconds), '-P', String(streams)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
  const code = await withTimeout('iperf3 -c', new Promise<number | null>((r) => child.once('close', r)), (seconds + 60) * 1000);
  let json: { error?: string; end?: { sum_received?: { bits_per_second: number; bytes: number } } } = {};
  try {
    json = JSON.parse(out) as typeof json;
  } catch {
    // not JSON: reported below
  }
  const sum = json.end?.sum_received;
  if (code !== 0 || !sum) throw new Error(`iperf3 -c ${host}:${port} -P ${streams} failed (exit ${code}): ${json.error ?? (err || out.slice(0, 2000))}`);
  return { bitsPerSecond: sum.bits_per_second, bytes: sum.bytes };
}
