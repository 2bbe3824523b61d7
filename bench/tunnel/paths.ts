/**
 * bench:tunnel's path setups: what both tunnels reach (squid, the sink, the echo, one iperf3 server per path), the
 * gateway's path (the Proxy, a user, the agent joined through squid and restarted, the client's way in), OpenSSH's
 * path (sshd and `ssh -R` with three forwards), the three data paths with the processes whose CPU each uses, and
 * the Rig that remembers everything started so that one cleanup stops it whatever phase failed.
 */
import { spawnSync } from 'node:child_process';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import getPort from 'get-port';
import { loadProfile, type Profile } from '../../src/client/profile.js';
import { openResource } from '../../src/client/resources.js';
import { Dialer } from '../../src/dial/dialer.js';
import { FramedStream } from '../../src/stream/framed.js';
import { runCli, startGateway, type RunningGateway } from '../../test/helpers/gateway.js';
import { waitForPort } from '../../test/helpers/netns.js';
import { startEchoServer, type TestServer } from '../../test/helpers/servers.js';
import { startSquid, type Squid } from '../../test/helpers/squid.js';
import { sleep } from '../common.js';
import { processTree, type CpuProbe } from '../lib/proc.js';
import { agentConfig, benchLookup, daemonEnv, proxyConfig, startAgent, stopGateway, type AgentStart, type LocalProxy } from './gateway.js';
import type { Tracked } from './idle.js';
import type { Connect } from './measure.js';
import { accepts, startCountingSink, startIperf3Server, startSshd, startSshTunnel, type CountingSink, type Iperf3Server, type Sshd, type SshTunnel } from './peers.js';
import type { PathName } from './report.js';
import { PASSWORD, PROXY_IP, PROXY_NAME, SSHD_IP, STARTS, TARGET_IP } from './settings.js';

/** Everything the bench started, for the cleanup whatever phase failed. */
export interface Rig {
  dir: string;
  say: (s: string) => void;
  squid?: Squid;
  proxy?: RunningGateway;
  agent?: RunningGateway;
  sshd?: Sshd;
  ssh?: SshTunnel;
  iperf?: Iperf3Server;
  iperfSsh?: Iperf3Server;
  gwshProxies: LocalProxy[];
  servers: TestServer[];
  track: Tracked;
}

/** The end points both tunnels reach (on TARGET_IP), and squid. */
export interface Ends {
  squid: Squid;
  sink: CountingSink;
  echo: TestServer;
  iperf: Iperf3Server;
  iperfSsh: Iperf3Server;
}

/** The gateway's path once it is up: how to reach it and restart its daemons. */
export interface GatewayPath {
  webPort: number;
  pin: string;
  proxyYaml: string;
  proxyDataDir: string;
  agentYaml: string;
  agentDataDir: string;
  adminEnv: Record<string, string>;
  starts: AgentStart[];
  viaGateway: (resource: 'sink' | 'echo') => Connect;
  clientTls: string;
}

/** OpenSSH's path once it is up: the forwarded ports on SSHD_IP. */
export interface OpenSshPath {
  fwd: { sink: number; echo: number; iperf: number };
  sshStarts: number[];
}

/** squid (with the hosts file only it reads), the sink, the echo, and one iperf3 server per path. */
export async function startEnds(rig: Rig): Promise<Ends> {
  const squid = (rig.squid = await startSquid({ extraConfig: [`hosts_file ${join(rig.dir, 'hosts')}`] }));
  const sink = await startCountingSink(TARGET_IP);
  const echo = await startEchoServer(TARGET_IP);
  rig.servers.push(sink, echo);
  // One iperf3 server per path, so that one path's test never waits for the other's to be wound up.
  const iperf = (rig.iperf = await startIperf3Server());
  const iperfSsh = (rig.iperfSsh = await startIperf3Server());
  return { squid, sink, echo, iperf, iperfSsh };
}

/** The gateway: Proxy, a user, a join token, the agent (joined once through squid, then restarted STARTS times). */
export async function startGatewayPath(rig: Rig, ends: Ends): Promise<GatewayPath> {
  const { dir } = rig;
  const { squid } = ends;
  const webPort = await getPort({ host: PROXY_IP });
  const proxyAddr = `${PROXY_NAME}:${webPort}`;
  const proxyYaml = proxyConfig('bench.example', webPort);
  const proxyDataDir = join(dir, 'proxy-data');
  const proxy = (rig.proxy = await startGateway(proxyYaml, { dataDir: proxyDataDir, env: daemonEnv() }));
  const adminEnv = { HOME: dir };
  const gwctl = async (args: string[], input?: string) => {
    const r = await runCli('gwctl', ['--data-dir', proxyDataDir, ...args], { env: adminEnv, ...(input === undefined ? {} : { input }) });
    if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.stderr}`);
    return r.stdout;
  };
  const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(await gwctl(['status']))![1]!;
  await gwctl(['users', 'add', 'bench', '--roles=access'], `${PASSWORD}\n`);
  const gwshHome = join(dir, 'gwsh');
  const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=bench', `--ca-pin=${pin}`], {
    env: { HOME: dir, GWSH_HOME: gwshHome, HTTPS_PROXY: squid.url },
    input: `${PASSWORD}\n`,
  });
  if (login.status !== 0) throw new Error(`gwsh login: ${login.stderr}`);
  const profile: Profile = loadProfile(gwshHome)!;
  const token = (JSON.parse(await gwctl(['tokens', 'add', '--type=app', '--uses=0', '--ttl=1h', '--format', 'json'])) as { token: string }).token;

  const agentYaml = agentConfig(ends.sink.port, ends.echo.port, ends.iperf.port);
  const agentDataDir = join(dir, 'agent-data');
  await mkdir(agentDataDir, { recursive: true });
  rig.agent = await startGateway(agentYaml, { dataDir: agentDataDir, args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr], env: { HTTPS_PROXY: squid.url } });
  await rig.agent.waitForLog('reverse tunnel ready', 30_000);
  await stopGateway(rig.agent);
  rig.agent = undefined;
  rig.say('gateway: Proxy up, agent joined through squid');

  const starts: AgentStart[] = [];
  for (let i = 0; i < STARTS; i++) {
    const s = await startAgent(proxy, agentYaml, agentDataDir, squid, daemonEnv());
    starts.push(s);
    if (i < STARTS - 1) await stopGateway(s.agent);
    else rig.agent = s.agent;
    await sleep(200);
  }
  if (!(await squid.readAccessLog()).some((l) => l.includes(`CONNECT ${proxyAddr} 200`))) throw new Error('the agent did not go through squid');
  rig.say(`gateway: tunnel ready in ${starts.map((s) => s.readyMs).join(', ')} ms`);

  const clientDialer = new Dialer({ env: {}, lookup: benchLookup });
  const viaGateway = (resource: 'sink' | 'echo'): Connect => () => openResource(profile, profile.proxy, { alpn: 'gateway-tcp', resource, kind: 'app' }, clientDialer);
  const probe = await viaGateway('echo')();
  // openResource hands back the TLS socket itself, or the frames over it (src/stream/framed.ts) from a Proxy that framed.
  const probeTls = (probe instanceof FramedStream ? probe.inner : probe) as TLSSocket;
  const clientTls = `${probeTls.getProtocol()} ${probeTls.getCipher().standardName}${probe instanceof FramedStream ? ', framed' : ''}`;
  probe.destroy();
  return { webPort, pin, proxyYaml, proxyDataDir, agentYaml, agentDataDir, adminEnv, starts, viaGateway, clientTls };
}

/** OpenSSH: sshd, then `ssh -R` with three forwards started STARTS times (the last one stays). */
export async function startOpenSshPath(rig: Rig, ends: Ends, cipher: string): Promise<OpenSshPath> {
  const { dir } = rig;
  spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', join(dir, 'host_key')]);
  spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', join(dir, 'user_key')]);
  await writeFile(join(dir, 'authorized_keys'), await readFile(join(dir, 'user_key.pub')));
  const sshd = (rig.sshd = await startSshd(dir));
  const fwd = { sink: await getPort({ host: SSHD_IP, exclude: [sshd.port] }), echo: 0, iperf: 0 };
  fwd.echo = await getPort({ host: SSHD_IP, exclude: [sshd.port, fwd.sink] });
  fwd.iperf = await getPort({ host: SSHD_IP, exclude: [sshd.port, fwd.sink, fwd.echo] });
  const forwards = [
    { listen: fwd.sink, to: ends.sink.port },
    { listen: fwd.echo, to: ends.echo.port },
    { listen: fwd.iperf, to: ends.iperfSsh.port },
  ];
  const sshStarts: number[] = [];
  for (let i = 0; i < STARTS; i++) {
    const t = await startSshTunnel(dir, ends.squid, sshd, cipher, forwards);
    sshStarts.push(t.readyMs);
    if (i < STARTS - 1) {
      await t.stop();
      // the forward's port is free again once sshd has closed the session
      for (let k = 0; k < 100 && (await accepts(SSHD_IP, fwd.sink)); k++) await sleep(20);
    } else rig.ssh = t;
  }
  await waitForPort(SSHD_IP, fwd.sink);
  rig.say(`OpenSSH: ssh -R ready in ${sshStarts.map((n) => n.toFixed(0)).join(', ')} ms`);
  return { fwd, sshStarts };
}

/** The data path's three paths: raw TCP, the gateway, OpenSSH; each with the processes whose CPU it uses. */
export function dataPaths(rig: Rig, ends: Ends, gw: GatewayPath, ssh: OpenSshPath): Array<{ name: PathName; sink: Connect; echo: Connect; cpu: CpuProbe }> {
  const direct = (host: string, port: number): Connect => () =>
    new Promise((resolve, reject) => {
      const s = net.connect({ host, port, noDelay: true }, () => resolve(s));
      s.once('error', reject);
    });
  return [
    { name: 'raw TCP', sink: direct(TARGET_IP, ends.sink.port), echo: direct(TARGET_IP, ends.echo.port), cpu: { 'client+sink (bench)': () => 'self' } },
    {
      name: 'gateway',
      sink: gw.viaGateway('sink'),
      echo: gw.viaGateway('echo'),
      cpu: { 'client+sink (bench)': () => 'self', 'Proxy daemon': () => [rig.proxy!.process.pid!], squid: () => [rig.squid!.pid], 'agent daemon': () => [rig.agent!.process.pid!] },
    },
    {
      name: 'OpenSSH ssh -R',
      sink: direct(SSHD_IP, ssh.fwd.sink),
      echo: direct(SSHD_IP, ssh.fwd.echo),
      cpu: { 'client+sink (bench)': () => 'self', sshd: () => processTree(rig.sshd!.pid), squid: () => [rig.squid!.pid], 'ssh + socat': () => processTree(rig.ssh!.process.pid!) },
    },
  ];
}


/** Stops the data path's agent and Proxy. */
export async function stopDaemons(rig: Rig): Promise<void> {
  await stopGateway(rig.agent);
  rig.agent = undefined;
  await stopGateway(rig.proxy);
  rig.proxy = undefined;
}

/** Stops whatever is still running, in the order the old single main did, and removes the directory. */
export async function cleanup(rig: Rig): Promise<void> {
  for (const h of rig.track.holders) await h.stop();
  await rig.ssh?.stop();
  await rig.sshd?.stop();
  for (const g of rig.gwshProxies) await g.stop();
  await rig.iperf?.stop();
  await rig.iperfSsh?.stop();
  await stopGateway(rig.agent);
  await stopGateway(rig.proxy);
  await stopGateway(rig.track.memProxy);
  for (const s of rig.servers) await s.close();
  await rig.squid?.stop();
  await rm(rig.dir, { recursive: true, force: true });
}
