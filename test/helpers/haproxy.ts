/**
 * HAProxy from Debian as the load balancer in front of several Proxies (or Auth Services): TCP mode, round robin,
 * optionally with a PROXY protocol v2 header to each server. Servers can be taken out and put back at run time
 * through HAProxy's admin socket ("disable server" / "enable server"), as an operator draining a Proxy would.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { waitForPort } from './netns.js';

export interface Balancer {
  /** host:port clients dial. */
  address: string;
  /** Takes a server out of rotation (existing connections stay) or puts it back. */
  setServer(name: string, state: 'enable' | 'disable'): Promise<string>;
  /** HAProxy's own answer to a runtime command ("show servers state", ...). */
  command(line: string): Promise<string>;
  stop(): Promise<void>;
}

export interface BalancerOptions {
  dir: string;
  /** Where it listens: host and port. */
  bind: { host: string; port: number };
  /** Backends by name: host:port. */
  servers: Record<string, string>;
  /** Send a PROXY protocol v2 header to each server (the Proxies then need proxy_protocol: on). */
  sendProxyV2?: boolean;
  /** Client/server idle timeout; a long one so that idle tunnels are cut by the gateway's heartbeats, not by HAProxy. */
  idleTimeout?: string;
  /** How to start the process (e.g. Firewall.spawnIn for a network namespace); node's spawn by default. */
  spawn?: (command: string, args: string[], options: SpawnOptions) => ChildProcess;
  /** Servers that start out of rotation (put them in with setServer). */
  disabled?: readonly string[];
  /** The address HAProxy connects to the servers from (its `source`), e.g. to tell its connections apart. */
  source?: string;
}

export async function startBalancer(options: BalancerOptions): Promise<Balancer> {
  const cfg = join(options.dir, 'haproxy.cfg');
  const socket = join(options.dir, 'haproxy.sock');
  const idle = options.idleTimeout ?? '10m';
  const servers = Object.entries(options.servers).map(
    ([name, addr]) => `  server ${name} ${addr}${options.sendProxyV2 ? ' send-proxy-v2' : ''} check inter 1s fall 2 rise 1${options.disabled?.includes(name) ? ' disabled' : ''}`,
  );
  await writeFile(
    cfg,
    [
      'global',
      '  maxconn 4000',
      `  stats socket ${socket} mode 600 level admin`,
      'defaults',
      '  mode tcp',
      '  timeout connect 5s',
      `  timeout client ${idle}`,
      `  timeout server ${idle}`,
      'frontend fe',
      `  bind ${options.bind.host}:${options.bind.port}`,
      '  default_backend be',
      'backend be',
      '  balance roundrobin',
      ...(options.source ? [`  source ${options.source}`] : []),
      // A connection to a server that just died goes to another one instead of failing.
      '  option redispatch',
      '  retries 3',
      ...servers,
      '',
    ].join('\n'),
  );
  const child: ChildProcess = (options.spawn ?? spawn)('/usr/sbin/haproxy', ['-f', cfg, '-db'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout?.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (output += c.toString()));
  try {
    await waitForPort(options.bind.host, options.bind.port);
  } catch (err) {
    child.kill('SIGKILL');
    throw new Error(`haproxy did not start: ${(err as Error).message}\n${output}`);
  }
  const command = (line: string): Promise<string> =>
    new Promise((resolve, reject) => {
      const c = net.connect(socket);
      let answer = '';
      c.on('data', (d: Buffer) => (answer += d.toString()));
      c.on('end', () => resolve(answer));
      c.on('error', reject);
      c.end(`${line}\n`);
    });
  return {
    address: `${options.bind.host}:${options.bind.port}`,
    command,
    setServer: (name, state) => command(`${state} server be/${name}`),
    stop: async () => {
      if (child.exitCode !== null) return;
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await gone;
    },
  };
}
