/**
 * bench:tunnel's section of bench/RESULTS.md: the table (data path, tunnel ready, user path, idle memory, the TLS
 * floor), then the paragraphs. The row labels are read by bench/record.ts (the chart, README's headline table):
 * keep them as they are.
 */
import { cpus, totalmem } from 'node:os';
import { median } from '../common.js';
import type { ProfileSummary } from '../lib/cpuprofile.js';
import { cipherSecondsPerGiB } from './measure.js';
import type { AgentStart } from './gateway.js';
import { tunnelProtocolText } from './gateway.js';
import { idleMemoryRows, idleMemoryText, type IdleMemory } from './idle.js';
import { DAEMON_GLIBC_TUNABLES, DAEMON_NODE_OPTIONS, MIB, MSG, PROFILE_MIB, PROXY_IP, PROXY_NAME, RTT_WARMUP, RTTS, RUNS, SSHD_IP, SSHD_NAME, STARTS, STREAMS, TARGET_IP } from './settings.js';
import { userPathRows, userPathText, type UserPathFigures } from './userpath.js';

/** The three paths of the data-path figures. */
export type PathName = 'raw TCP' | 'gateway' | 'OpenSSH ssh -R';

/** Single- and multi-stream MiB/s per run, CPU seconds per GiB by component, round trips: per path. */
export interface DataPathFigures {
  single: Map<PathName, number[]>;
  multi: Map<PathName, number[]>;
  cpuPerGiB: Map<PathName, Record<string, number>>;
  rtt: Map<PathName, { p50: number; p99: number }>;
}

/** Everything the section says, as main measured it. */
export interface TunnelFigures {
  began: number;
  load0: number;
  /** Load average after the data-path figures. */
  load1: number;
  squidHost: string;
  /** The client's TLS as the probe saw it. */
  clientTls: string;
  sshVersion: string;
  cipher: string;
  starts: AgentStart[];
  sshStarts: number[];
  data: DataPathFigures;
  user: UserPathFigures;
  gwshProfile: ProfileSummary | undefined;
  mem: IdleMemory;
  profiles: { proxy?: ProfileSummary; agent?: ProfileSummary };
  profiledRate: number | undefined;
}

const G = 'gateway' as const;
const O = 'OpenSSH ssh -R' as const;
const R = 'raw TCP' as const;
const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;
const f0 = (n: number) => n.toFixed(0);
const f1 = (n: number) => n.toFixed(1);

type Row = [string, (p: PathName) => number, (n: number) => string, 'higher' | 'lower'];

/** The data path's rows: throughput and round trips, with which way is better. */
function dataRows(d: DataPathFigures): Row[] {
  const med = (m: Map<PathName, number[]>, n: PathName) => median(m.get(n)!);
  return [
    ['throughput, 1 stream (MiB/s, median of ' + RUNS + ')', (p) => med(d.single, p), f0, 'higher'],
    [`throughput, ${STREAMS} streams (MiB/s aggregate, median of ${RUNS})`, (p) => med(d.multi, p), f0, 'higher'],
    ['64-byte round trip p50 (µs)', (p) => d.rtt.get(p)!.p50, f1, 'lower'],
    ['64-byte round trip p99 (µs)', (p) => d.rtt.get(p)!.p99, f1, 'lower'],
  ];
}

/** The section's table. */
function table(f: TunnelFigures, rows: Row[]): string[] {
  const { mem, starts, sshStarts } = f;
  return [
    `| figure | raw TCP | gateway | OpenSSH ssh -R (peer) | gateway / OpenSSH | gateway / raw |`,
    '|---|---|---|---|---|---|',
    ...rows.map(([label, get, fmt]) => `| ${label} | ${fmt(get(R))} | ${fmt(get(G))} | ${fmt(get(O))} | ${ratio(get(G), get(O))} | ${ratio(get(G), get(R))} |`),
    `| agent start -> tunnel ready (ms, median of ${STARTS}) | – | ${f0(median(starts.map((s) => s.readyMs)))} | ${f0(median(sshStarts))} | ${ratio(median(starts.map((s) => s.readyMs)), median(sshStarts))} | – |`,
    ...userPathRows(f.user),
    ...idleMemoryRows(mem),
    ...(mem.floor
      ? [
          `| floor: a bare Node.js TLS server per idle connection with a client certificate, ${mem.floor.connections} connections (KiB of VmRSS, bench/tlsfloor.ts) | – | ${mem.floor.mtlsKiB.toFixed(1)} | – | – | – |`,
          `| floor: the same, the server sending no TLS session tickets (as the Proxy's tunnel route) (KiB of VmRSS) | – | ${mem.floor.mtlsNoTicketKiB.toFixed(1)} | – | – | – |`,
        ]
      : []),
  ];
}

/** The paragraph above the table: what ran where, and the machine. */
function intro(f: TunnelFigures): string[] {
  const cpu = cpus();
  return [
    `Run ${new Date(f.began).toISOString()} with \`npm run bench:tunnel\` (${Math.round((Date.now() - f.began) / 1000)} s). ` +
      `Client in the bench process; sink and echo servers on ${TARGET_IP} (same process); squid 5 (Debian) on ${f.squidHost}; ` +
      `gateway: real \`gateway start\` daemons, the Proxy (auth + proxy) on ${PROXY_IP} and an app_service agent whose reverse tunnel ` +
      `(${tunnelProtocolText(f.starts)}) goes through squid to ${PROXY_NAME}, a name only squid resolves; the client opens ` +
      `gateway-tcp streams with a gwsh profile (openResource, ${f.clientTls}). ` +
      `Peer: ${f.sshVersion} \`sshd\` on ${SSHD_IP} and \`ssh -N -R\` with \`ProxyCommand=socat - PROXY:\` through the same squid ` +
      `to ${SSHD_NAME}; the client connects to the forwarded port. Both SSH connections: ${f.cipher}, ECDSA P-256 keys. ` +
      `Throughput: ${MIB} MiB per run (${STREAMS} streams share it in the parallel case), median of ${RUNS}, paths interleaved; ` +
      `round trip: ${RTTS} samples of ${MSG} bytes on one established stream after ${RTT_WARMUP} unmeasured ones (the steady state: with 200, V8 was still compiling the gateway's path and its p99 on the user path was 5-7 times higher); nothing pinned to a CPU` +
      `${DAEMON_NODE_OPTIONS ? `; daemons run with NODE_OPTIONS="${DAEMON_NODE_OPTIONS}"` : ''}` +
      `${DAEMON_GLIBC_TUNABLES ? `; daemons run with GLIBC_TUNABLES="${DAEMON_GLIBC_TUNABLES}"` : ''}.`,
    `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}, ${f.sshVersion}, ` +
      `cipher ${f.cipher}; load average ${f.load0.toFixed(2)} at the start, ${f.load1.toFixed(2)} after the data-path figures (other work shared the machine).`,
  ];
}

/** The section, from its heading to the last paragraph. */
export function tunnelSection(f: TunnelFigures): string {
  const { data, starts, sshStarts, profiles } = f;
  const rows = dataRows(data);
  const wins = rows.map(([label, get, , better]) => ({ label, win: better === 'higher' ? get(G) > get(O) : get(G) < get(O) }));
  const components = (p: PathName) =>
    Object.entries(data.cpuPerGiB.get(p)!)
      .map(([k, v]) => `${k} ${v.toFixed(2)}`)
      .join(', ');
  const cpuTotal = (p: PathName) => Object.values(data.cpuPerGiB.get(p)!).reduce((a, b) => a + b, 0);
  const fmtTop = (s: ProfileSummary) => s.top.slice(0, 5).map((t) => `\`${t.frame}\` ${(t.share * 100).toFixed(0)}%`).join(', ');
  const fmtGroups = (s: ProfileSummary) =>
    Object.entries(s.groups)
      .map(([k, v]) => `${k} ${(v * 100).toFixed(0)}%`)
      .join(', ');
  const lost = wins.filter((w) => !w.win).map((w) => w.label.replace(/ \(.*$/, ''));
  const startMed = { started: median(starts.map((s) => s.startedMs)), ready: median(starts.map((s) => s.readyMs)), proxy: median(starts.map((s) => s.proxyMs)) };
  const section = [
    '## tunnel',
    '',
    ...intro(f),
    '',
    ...table(f, rows),
    '',
    `- Ratios: throughput above 1 and times below 1 are better for the gateway. The gateway ${lost.length === 0 ? 'beats OpenSSH on every throughput and latency figure' : `does not beat OpenSSH on: ${lost.join('; ')}`}.`,
    `- Tunnel ready: spawn -> "gateway started" ${f0(startMed.started)} ms (Node start, configuration, stored identity), -> "reverse tunnel ready" ${f0(startMed.ready)} ms, ` +
      `the Proxy logged "agent connected" at ${f0(startMed.proxy)} ms (each start: ${starts.map((s) => f0(s.readyMs)).join(', ')} ms; ssh: ${sshStarts.map(f0).join(', ')} ms).`,
    userPathText(f.user, f.gwshProfile),
    idleMemoryText(f.mem),
    `- CPU seconds per GiB moved (single stream, by process): gateway ${components(G)} (total ${cpuTotal(G).toFixed(2)}); ` +
      `OpenSSH ${components(O)} (total ${cpuTotal(O).toFixed(2)}); raw TCP ${components(R)}.`,
    ...(profiles.proxy && profiles.agent
      ? [
          `- CPU profile (V8 sampler, as \`--cpu-prof\`, started after a warm-up stream; one ${PROFILE_MIB} MiB stream at ${f0(f.profiledRate!)} MiB/s plus 2 000 round trips; shares of busy time). ` +
            `Proxy: ${fmtTop(profiles.proxy)}; by group ${fmtGroups(profiles.proxy)}. ` +
            `Agent: ${fmtTop(profiles.agent)}; by group ${fmtGroups(profiles.agent)}.`,
        ]
      : []),
    `- Where the time goes: WHERE_PLACEHOLDER`,
    '',
  ].join('\n');
  const aes = { 256: cipherSecondsPerGiB('aes-256-gcm'), 128: cipherSecondsPerGiB('aes-128-gcm') };
  const med = (m: Map<PathName, number[]>, n: PathName) => median(m.get(n)!);
  const where = whereTheTimeGoes({
    aes,
    G: data.cpuPerGiB.get(G)!,
    O: data.cpuPerGiB.get(O)!,
    lost,
    profiles,
    single: med(data.single, G) / med(data.single, O),
    multi: med(data.multi, G) / med(data.multi, O),
    p50: data.rtt.get(G)!.p50 / data.rtt.get(O)!.p50,
    p99: data.rtt.get(G)!.p99 / data.rtt.get(O)!.p99,
    v2: starts.every((s) => s.protocol === 'v2'),
  });
  return section.replace('WHERE_PLACEHOLDER', where);
}

/** One honest paragraph from the measured CPU split and the profiles. */
function whereTheTimeGoes(d: {
  G: Record<string, number>;
  O: Record<string, number>;
  lost: string[];
  profiles: { proxy?: ProfileSummary; agent?: ProfileSummary };
  /** CPU seconds per GiB of one AES-GCM pass (TLS 1.3 here uses AES-256-GCM, the SSH connections AES-128-GCM). */
  aes: { 128: number; 256: number };
  /** gateway / OpenSSH */
  single: number;
  multi: number;
  p50: number;
  p99: number;
  /** The tunnel protocol negotiated: v2 (frames over TLS) or v1 (SSH over TLS). */
  v2: boolean;
}): string {
  const total = (r: Record<string, number>) => Object.values(r).reduce((a, b) => a + b, 0);
  const pct = (n: number) => `${(n * 100).toFixed(0)}%`;
  const x = (n: number) => `${n.toFixed(2)}x`;
  const cpuRatio = total(d.G) / total(d.O);
  const gatewayCipher = 4 * d.aes[256] + (d.v2 ? 0 : 2 * d.aes[128]);
  const opensshCipher = 2 * d.aes[128];
  const cipherShare = (gatewayCipher - opensshCipher) / Math.max(1e-9, total(d.G) - total(d.O));
  const latency =
    d.p50 <= 1
      ? `The median round trip is at or below OpenSSH's (${x(d.p50)}): a 64-byte message costs little CPU, and both paths cross a similar chain of processes each way (Proxy, squid, agent against sshd, squid, socat, ssh)`
      : d.p50 < 1.25
        ? `The median round trip is close to OpenSSH's (${x(d.p50)}): a 64-byte message costs little CPU, and both paths cross a similar chain of processes each way (Proxy, squid, agent against sshd, squid, socat, ssh); the extra is the gateway's per-message work (${d.v2 ? 'two TLS records and a frame header in the Proxy, a TLS record in the agent' : 'two TLS records and an SSH packet in the Proxy, the same again in the agent'})`
        : `The median round trip is ${x(d.p50)} OpenSSH's: each message is a TLS record from the client, ${d.v2 ? 'a frame' : 'an SSH packet'} inside a TLS record to the agent and the same back, each step a JavaScript callback chain in the Proxy and the agent`;
  const tail = `; p99 (${x(d.p99)}) is mostly scheduling: the path's processes share two cores with each other${d.p99 > 1.5 || d.p99 < 0.67 ? ' and with whatever else runs, so it swings from run to run' : ''}.`;
  const parts = [
    `${d.lost.length === 0 ? 'the gateway is ahead on every data-path figure, though ' : ''}per GiB moved the gateway's path uses ${total(d.G).toFixed(2)} CPU-s against OpenSSH's ${total(d.O).toFixed(2)} ` +
      `(${cpuRatio.toFixed(2)}x): the Proxy daemon ${(d.G['Proxy daemon'] ?? 0).toFixed(2)} s and the agent ${(d.G['agent daemon'] ?? 0).toFixed(2)} s, ` +
      `where sshd uses ${(d.O.sshd ?? 0).toFixed(2)} s and ssh + socat ${(d.O['ssh + socat'] ?? 0).toFixed(2)} s. With every process of the path on two cores, ` +
      `a stream goes as fast as the CPU left to its hops allows: one stream reached ${x(d.single)} OpenSSH's rate, ${STREAMS} streams ${x(d.multi)}. ` +
      `Parallel streams add no thread to either tunnel: all of them share one tunnel connection, so one JavaScript thread in the Proxy and one in the agent (one sshd session process and one ssh) carry them all.`,
    latency + tail,
  ];
  const p = d.profiles.proxy;
  const a = d.profiles.agent;
  if (p && a) {
    const split = (s: ProfileSummary) =>
      `${pct(s.groups['socket writes'])} in socket writes, ${pct(s.groups.ssh2)} in ssh2, ${pct(s.groups['node streams'])} in Node's stream code and ${pct(s.groups['garbage collector'])} in GC`;
    parts.push(
      `The Proxy spends ${split(p)}; the agent ${split(a)}. "Socket writes" are the native writev/writeBuffer: for the tunnel's TLS socket the record encryption and then the write ` +
        'syscall, for a plain socket the syscall alone, which on loopback also runs the receiving side\'s TCP input. ' +
        `In the agent ${pct(a.splicedWrites)} of that write time is the plain write() of each ${d.v2 ? 'frame' : 'packet'}'s bytes to the resource; in the Proxy ${pct(1 - p.splicedWrites)} is the tunnel's TLS socket (${d.v2 ? 'frames, corked for the rest of the tick and flushed with writev' : 'SSH packets, written at once or queued and flushed with writev'}). ` +
        `The ciphers are ${cipherShare < 0.4 ? 'a small' : cipherShare < 0.7 ? 'a large' : 'most of the'} part of the difference: at the AES-GCM speed \`openssl speed\` measures on this machine (${(1 / d.aes[256]).toFixed(1)} GiB/s per core for AES-256, ${(1 / d.aes[128]).toFixed(1)} for AES-128), ` +
        `the gateway's ${d.v2 ? 'four' : 'six'} passes over each byte (encrypt and decrypt of the client's TLS${d.v2 ? '' : ', of SSH'} and of the tunnel's TLS) cost ${gatewayCipher.toFixed(2)} CPU-s per GiB and OpenSSH's two ${opensshCipher.toFixed(2)}, ` +
        `${(gatewayCipher - opensshCipher).toFixed(2)} of the ${(total(d.G) - total(d.O)).toFixed(2)} CPU-s difference. The rest is per chunk: ` +
        (d.v2
          ? 'the client\'s TLS socket delivers 16 KiB records (Node\'s TLS hands JavaScript at most 16 KiB per read), each becomes one frame (a 9-byte header and the bytes as they came) in a TLS record to the agent, ' +
            'and the agent makes one write() to the resource per frame, while sshd and ssh move up to 32 KiB packets through buffered C code. '
          : 'the client\'s TLS socket delivers 16 KiB records, each becomes one 16 KiB SSH packet (a fresh Buffer, random padding, a cipher call, a TLS record and a write in the Proxy), ' +
            'and the agent decrypts it and makes one write() to the resource per packet, while sshd and ssh move up to 32 KiB packets through buffered C code. ') +
        'ssh -R\'s client leg is plain TCP, and its tunnel is SSH alone, with no TLS around it: the gateway\'s client leg is TLS because the user\'s certificate is checked there.',
    );
  }
  return parts.join(' ');
}
