/**
 * bench:dial's second part: connection set-up through a proxy that asks for authentication, per scheme, each
 * against curl through the same proxy in the same run. Basic and Digest (squid's basic_ncsa_auth and
 * digest_file_auth), NTLM (the NTLM lab: squid with Samba's ntlm_auth and winbindd; needs root) and Negotiate (the
 * Kerberos lab: an MIT KDC and squid's negotiate_kerberos_auth; needs the kerberos module).
 *
 * One sample: a fresh Dialer (so every sample does the whole 407 exchange, as each curl run does: a Dialer that
 * already answered Basic sends it first next time) dials the target through the proxy, sends a small HTTP GET and
 * reads the whole answer. curl's sample is the same GET with `-p` (a CONNECT tunnel) and `--proxy-anyauth` (or
 * `--proxy-negotiate` / `--proxy-ntlm`), timed by curl itself (`%{time_total}`: its process start is not counted).
 * Samples alternate between the two so that the machine's load falls on both alike.
 */
import http from 'node:http';
import type net from 'node:net';
import { loadavg } from 'node:os';
import { Dialer } from '../src/dial/dialer.js';
import { loadGssapi } from '../src/dial/auth/negotiate.js';
import { curl } from '../test/helpers/curl.js';
import { startKerberosLab } from '../test/helpers/kerberos.js';
import { startNtlmLab } from '../test/helpers/ntlm.js';
import { startSquid } from '../test/helpers/squid.js';
import { percentile } from './common.js';

const SAMPLES = Number(process.env.BENCH_AUTH_SAMPLES ?? 40);

interface Lab {
  scheme: string;
  /** The Dialer's proxy URL, and how it resolves the proxy's name. */
  proxyUrl: string;
  lookup?: net.LookupFunction;
  /** curl's proxy arguments. */
  curlArgs: string[];
  env?: Record<string, string>;
  stop: () => Promise<unknown>;
}

export interface AuthRow {
  scheme: string;
  dialer: { p50: number; p90: number };
  curl: { p50: number; p90: number };
}

/** GET / through a socket the Dialer returned, resolving when the answer ends (the server closes). */
function getOnce(socket: net.Socket, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    socket.on('data', () => undefined);
    socket.once('end', () => (socket.destroy(), resolve()));
    socket.once('error', reject);
    socket.write(`GET / HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
  });
}

async function measure(lab: Lab, target: string): Promise<AuthRow> {
  const ours: number[] = [];
  const theirs: number[] = [];
  const saved = { ...process.env };
  Object.assign(process.env, lab.env ?? {}); // GSSAPI reads the process's environment
  try {
    for (let i = 0; i < SAMPLES + 3; i++) {
      const t0 = process.hrtime.bigint();
      const dialer = new Dialer({ env: { HTTPS_PROXY: lab.proxyUrl }, ...(lab.lookup ? { lookup: lab.lookup } : {}) });
      await getOnce(await dialer.dial(target), target);
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      const r = await curl(['-p', ...lab.curlArgs, '-o', '/dev/null', '-w', '%{time_total}', `http://${target}/`], lab.env ?? {});
      if (r.status !== 0) throw new Error(`curl through the ${lab.scheme} proxy failed: ${r.stderr}`);
      if (i < 3) continue; // warm-up: the first tickets, helpers started by squid
      ours.push(ms);
      theirs.push(Number(r.stdout) * 1000);
    }
  } finally {
    for (const k of Object.keys(lab.env ?? {})) {
      if (saved[k] === undefined) delete process.env[k];
      else process.env[k] = saved[k];
    }
  }
  const stats = (xs: number[]) => (xs.sort((a, b) => a - b), { p50: percentile(xs, 50), p90: percentile(xs, 90) });
  return { scheme: lab.scheme, dialer: stats(ours), curl: stats(theirs) };
}

const nameLookup = (name: string, address: string): net.LookupFunction => (hostname, options, callback) => {
  if (hostname !== name) throw new Error(`unexpected lookup of ${hostname}`);
  if ((options as { all?: boolean }).all) (callback as never as (e: null, a: Array<{ address: string; family: number }>) => void)(null, [{ address, family: 4 }]);
  else (callback as never as (e: null, a: string, f: number) => void)(null, address, 4);
};

/** The labs that can run here, one at a time (each is stopped before the next starts). */
function labs(hostsFile: string): Array<{ scheme: string; start: () => Promise<Lab>; skip?: string }> {
  const squidConfig = [`hosts_file ${hostsFile}`];
  const user = 'bench';
  const password = 'bench-Pw-1';
  const plain = (scheme: 'basic' | 'digest') => async (): Promise<Lab> => {
    const squid = await startSquid({ auth: { user, password, schemes: [scheme] }, extraConfig: squidConfig });
    return { scheme: scheme === 'basic' ? 'Basic' : 'Digest', proxyUrl: `http://${user}:${password}@${squid.host}:${squid.port}`, curlArgs: ['-x', squid.url, '--proxy-anyauth', '-U', `${user}:${password}`], stop: () => squid.stop() };
  };
  let gss = true;
  try {
    loadGssapi();
  } catch {
    gss = false;
  }
  const root = process.getuid?.() === 0;
  return [
    { scheme: 'Basic', start: plain('basic') },
    { scheme: 'Digest', start: plain('digest') },
    {
      scheme: 'NTLM',
      ...(root ? {} : { skip: 'needs root (the NTLM lab makes an OS user and a mount namespace)' }),
      start: async () => {
        const lab = await startNtlmLab({ squidConfig });
        const url = `http://${encodeURIComponent(lab.account)}:${encodeURIComponent(lab.user.password)}@${lab.squid.host}:${lab.squid.port}`;
        return { scheme: 'NTLM', proxyUrl: url, curlArgs: ['-x', lab.squid.url, '--proxy-ntlm', '-U', `${lab.account}:${lab.user.password}`], stop: () => lab.stop() };
      },
    },
    {
      scheme: 'Negotiate',
      ...(gss ? {} : { skip: 'the kerberos module is not installed' }),
      start: async () => {
        const lab = await startKerberosLab({ squidConfig });
        return {
          scheme: 'Negotiate',
          proxyUrl: lab.proxyUrl,
          lookup: nameLookup(lab.proxyHost, lab.squid.host),
          curlArgs: ['-x', lab.proxyUrl, '--resolve', lab.resolve, '--proxy-negotiate', '-U', ':'],
          env: lab.env,
          stop: () => lab.stop(),
        };
      },
    },
  ];
}

/** Measures every scheme that can run here; returns the table's rows, what was skipped, and the load around it. */
export async function authSetupRows(hostsFile: string, target: string): Promise<{ rows: AuthRow[]; skipped: string[]; load: [number, number] }> {
  const before = loadavg()[0]!;
  const rows: AuthRow[] = [];
  const skipped: string[] = [];
  for (const l of labs(hostsFile)) {
    if (l.skip) {
      skipped.push(`${l.scheme}: ${l.skip}`);
      continue;
    }
    const lab = await l.start();
    try {
      rows.push(await measure(lab, target));
    } finally {
      await lab.stop();
    }
  }
  return { rows, skipped, load: [before, loadavg()[0]!] };
}

/** The small HTTP server the GETs go to. */
export async function startTinyHttp(host: string): Promise<{ port: number; close: () => Promise<void> }> {
  const server = http.createServer((_req, res) => res.end('ok\n'));
  await new Promise<void>((r) => server.listen(0, host, r));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => new Promise((r) => (server.closeAllConnections(), server.close(() => r()))),
  };
}
