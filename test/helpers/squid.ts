/**
 * Starts a real squid (Debian's /usr/sbin/squid, 5.x) for tests.
 *
 * Each instance runs in the foreground (`squid -N`) with its own squid.conf,
 * logs, pid file and coredump dir in a fresh temp dir, listening on a free
 * port of a loopback address other than 127.0.0.1 (default 127.0.0.2), so
 * several can run at once. Always `stop()` it (e.g. in afterAll); squids
 * still running when the test process exits are SIGKILLed.
 *
 * Access log: one line per transaction, fields separated by single spaces:
 *   time client method url status user bytes-from-client bytes-to-client squid-status
 * e.g. `1795239547.944 127.0.0.1 CONNECT 127.0.0.3:31999 200 alice 65 39 TCP_TUNNEL`.
 * Squid writes a CONNECT line only when the tunnel closes.
 *
 * With `bump`, the http_port inspects TLS (squid-openssl's ssl_bump, as a corporate egress does): it mints a
 * certificate for each CONNECT's host, signed by the CA given, with Debian's security_file_certgen and a
 * certificate database of its own; the `ssl_bump` rules go in extraConfig (`ssl_bump bump all`, and `ssl_bump
 * splice` for the names left alone).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { chown, copyFile, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { promisify } from 'node:util';
import getPort from 'get-port';

const SQUID = '/usr/sbin/squid';
const NCSA_AUTH = '/usr/lib/squid/basic_ncsa_auth';
const DIGEST_AUTH = '/usr/lib/squid/digest_file_auth';
/** The realm of both authentication schemes. */
const REALM = 'gateway-test';
const CERTGEN = '/usr/lib/squid/security_file_certgen';
/** Readiness probes connect from this address; readAccessLog() drops their lines. */
const PROBE_SOURCE = '127.0.0.254';

export interface SquidOptions {
  /** Address to listen on (an IPv6 one without brackets). Default 127.0.0.2. */
  host?: string;
  /** Port to listen on; default a free one (give one for a squid in a namespace, where this process cannot look). */
  port?: number;
  /** Run squid inside this network namespace (ip netns exec). */
  netns?: string;
  /** Client networks allowed besides loopback (CIDRs). */
  clients?: string[];
  /**
   * Require proxy authentication; missing/wrong credentials get 407. `schemes` (default ['basic']): 'basic' is
   * basic_ncsa_auth with an htpasswd file, 'digest' is digest_file_auth -c with a user:realm:HA1 file (HA1 is
   * MD5(user:realm:password), so any password works, ':' included). Both at once: squid offers both challenges, in this order.
   */
  auth?: { user: string; password: string; schemes?: Array<'basic' | 'digest'> };
  /**
   * Also write auth.log: one line per transaction, `method url status scheme`, scheme being the first word of the
   * request's Proxy-Authorization ("-" when it had none), to show which scheme a client answered with.
   */
  logAuthScheme?: boolean;
  /** Allow CONNECT only to these ports (others get 403). Default: any port. */
  connectPorts?: number[];
  /** Also listen with `https_port` (TLS to the proxy itself); PEM file paths. */
  tls?: { cert: string; key: string };
  /**
   * Inspect TLS on the http_port (ssl-bump) with certificates made for each host and signed by this CA (PEM file
   * paths); `upstreamCa` is what squid trusts for the servers behind it (a PEM file path; system CAs otherwise).
   */
  bump?: { caCert: string; caKey: string; upstreamCa?: string };
  /** Extra squid.conf lines, placed before the http_access rules. */
  extraConfig?: string[];
  /** Environment of squid and so of its helpers (added to this process's), e.g. KRB5_CONFIG. */
  env?: Record<string, string>;
  /** A command that execs squid (its arguments follow), e.g. nsenter into a lab's mount namespace. */
  launcher?: string[];
  /** Overall deadline for startup. Default 20 s. */
  startTimeoutMs?: number;
}

export interface Squid {
  host: string;
  port: number;
  /** "http://HOST:PORT" */
  url: string;
  httpsPort?: number;
  /** "https://HOST:HTTPSPORT" when `tls` was given. */
  httpsUrl?: string;
  pid: number;
  /** The temp dir (removed by stop()). */
  dir: string;
  accessLogPath: string;
  cacheLogPath: string;
  /** With logAuthScheme: auth.log's lines, `method url status scheme` ("-" for none). */
  readAuthLog(): Promise<string[]>;
  /** Current access log lines (empty if nothing was logged yet), minus the readiness probes' lines. */
  readAccessLog(): Promise<string[]>;
  /** Polls the access log until a line matches; rejects after `timeoutMs` (default 10 s). */
  waitForAccessLog(predicate: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  /** SIGTERM, SIGKILL after 5 s if still running, then removes the temp dir. Idempotent. */
  stop(): Promise<void>;
}

/** One access log line, split into its fields (see the module doc). */
export interface AccessLogEntry {
  time: number;
  client: string;
  method: string;
  url: string;
  status: number;
  /** Authenticated user name, or undefined ("-"). */
  user: string | undefined;
  bytesFromClient: number;
  bytesToClient: number;
  squidStatus: string;
}

export function parseAccessLogLine(line: string): AccessLogEntry {
  const [time, client, method, url, status, user, fromClient, toClient, squidStatus] = line.trim().split(' ');
  return {
    time: Number(time),
    client: client ?? '',
    method: method ?? '',
    url: url ?? '',
    status: Number(status),
    user: user === '-' || user === undefined ? undefined : user,
    bytesFromClient: Number(fromClient),
    bytesToClient: Number(toClient),
    squidStatus: squidStatus ?? '',
  };
}

const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const run = promisify(execFile);

/** uid/gid squid switches to when started as root (cache_effective_user, default "proxy"). */
export function proxyUser(): { uid: number; gid: number } | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const line = readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith('proxy:'));
  if (!line) throw new Error('squid runs as user "proxy" when started as root, but /etc/passwd has no such user');
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

const bracket = (host: string) => (net.isIPv6(host) ? `[${host}]` : host);

function squidConf(dir: string, host: string, port: number, httpsPort: number | undefined, o: SquidOptions): string {
  const lines = [
    '# generated by test/helpers/squid.ts',
    `http_port ${bracket(host)}:${port}${o.bump ? ` ssl-bump generate-host-certificates=on dynamic_cert_mem_cache_size=4MB tls-cert=${dir}/bump-ca.pem tls-key=${dir}/bump-ca.key` : ''}`,
    ...(o.bump
      ? [
          `sslcrtd_program ${CERTGEN} -s ${dir}/ssl_db -M 4MB`,
          'sslcrtd_children 2 startup=1 idle=1',
          ...(o.bump.upstreamCa ? [`tls_outgoing_options cafile=${dir}/upstream-ca.pem`] : []),
        ]
      : []),
    ...(httpsPort ? [`https_port ${host}:${httpsPort} tls-cert=${dir}/tls-cert.pem tls-key=${dir}/tls-key.pem`] : []),
    'visible_hostname gateway-test-squid',
    `pid_filename ${dir}/squid.pid`,
    `coredump_dir ${dir}`,
    `cache_log ${dir}/cache.log`,
    'logformat gateway %ts.%03tu %>a %rm %ru %>Hs %un %>st %<st %Ss',
    `access_log stdio:${dir}/access.log logformat=gateway`,
    ...(o.logAuthScheme ? ['logformat gwauth %rm %ru %>Hs %{Proxy-Authorization}>h', `access_log stdio:${dir}/auth.log logformat=gwauth`] : []),
    'buffered_logs off',
    'logfile_rotate 0',
    'netdb_filename none',
    'cache deny all',
    'cache_mem 8 MB',
    'pinger_enable off',
    'shutdown_lifetime 0 seconds',
    'icp_port 0',
    'htcp_port 0',
    // IP-literal targets never touch DNS; names come from /etc/hosts first; the
    // nameservers of /etc/resolv.conf are used otherwise: bound the wait offline.
    'hosts_file /etc/hosts',
    'dns_timeout 5 seconds',
    `acl loopback src 127.0.0.0/8 ::1${(o.clients ?? []).map((c) => ` ${c}`).join('')}`,
  ];
  if (o.connectPorts) lines.push(`acl SSL_ports port ${o.connectPorts.join(' ')}`);
  for (const scheme of o.auth ? (o.auth.schemes ?? ['basic']) : []) {
    if (scheme === 'basic') {
      lines.push(
        `auth_param basic program ${NCSA_AUTH} ${dir}/passwd`,
        'auth_param basic children 2 startup=1 idle=1',
        `auth_param basic realm ${REALM}`,
      );
    } else {
      lines.push(
        `auth_param digest program ${DIGEST_AUTH} -c ${dir}/digest-passwd`,
        'auth_param digest children 2 startup=1 idle=1',
        `auth_param digest realm ${REALM}`,
        'auth_param digest nonce_garbage_interval 5 minutes',
      );
    }
  }
  if (o.auth) lines.push('acl authenticated proxy_auth REQUIRED');
  lines.push(...(o.extraConfig ?? []), 'http_access deny !loopback');
  if (o.connectPorts) lines.push('http_access deny CONNECT !SSL_ports');
  if (o.auth) lines.push('http_access deny !authenticated');
  lines.push('http_access allow loopback', 'http_access deny all', '');
  return lines.join('\n');
}

/**
 * True once host:port accepts a TCP connection. Made from PROBE_SOURCE so that
 * readAccessLog() can drop the "error:transaction-end-before-headers" line it
 * causes (an access_log `src` ACL does not apply to such request-less lines).
 */
function accepts(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const localAddress = net.isIPv4(host) && host.startsWith('127.') ? PROBE_SOURCE : undefined;
    const s = net.connect({ host, port, localAddress });
    s.setTimeout(1000);
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
    s.once('timeout', () => (s.destroy(), resolve(false)));
  });
}

/**
 * True once squid's cache.log says it listens on every port and each accepts a
 * connection (the log proves squid, not another process, owns the port; the
 * probe proves listen() happened).
 */
async function listening(cacheLog: string, host: string, ports: Array<number | undefined>): Promise<boolean> {
  const log = existsSync(cacheLog) ? await readFile(cacheLog, 'utf8') : '';
  for (const port of ports) {
    if (port === undefined) continue;
    if (!log.split('\n').some((l) => l.includes('Socket connections at') && l.includes(` local=${bracket(host)}:${port} `))) return false;
    if (!(await accepts(host, port))) return false;
  }
  return true;
}

async function tail(path: string, n = 30): Promise<string> {
  try {
    return (await readFile(path, 'utf8')).trimEnd().split('\n').slice(-n).join('\n');
  } catch {
    return '(no cache.log)';
  }
}

/**
 * The command line of the squid whose files are in `dir` (made by startSquid): in the foreground, with its
 * squid.conf, and with a service name of its own. Squid names its shared memory segments after the service
 * (/dev/shm/<name>-*.shm); with the default name "squid", two squids at once collide. Root's squid removes the
 * other's segment and carries on; any other user's cannot remove a segment it does not own and exits
 * ("shm_open(/squid-cf__metadata.shm): File exists").
 */
export function squidArgs(dir: string): string[] {
  const serviceName = `gwtest${basename(dir).replace(/[^A-Za-z0-9]/g, '')}`.slice(0, 32);
  return ['-N', '-n', serviceName, '-f', join(dir, 'squid.conf')];
}

/** Starts squid; retries with new ports if a port was taken in the meantime. */
export async function startSquid(options: SquidOptions = {}): Promise<Squid> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(options);
    } catch (err) {
      if (attempt >= 3 || !/Address already in use/i.test(String(err))) throw err;
    }
  }
}

async function startOnce(o: SquidOptions): Promise<Squid> {
  const host = o.host ?? '127.0.0.2';
  const deadline = Date.now() + (o.startTimeoutMs ?? 20_000);
  const dir = await mkdtemp(join(tmpdir(), 'gw-squid-'));
  const port = o.port ?? (await getPort({ host }));
  const httpsPort = o.tls ? await getPort({ host, exclude: [port] }) : undefined;
  const conf = join(dir, 'squid.conf');
  const files = [conf];
  await writeFile(conf, squidConf(dir, host, port, httpsPort, o));
  if (o.auth) {
    const { stdout } = await run('openssl', ['passwd', '-apr1', o.auth.password]);
    await writeFile(join(dir, 'passwd'), `${o.auth.user}:${stdout.trim()}\n`, { mode: 0o600 });
    const ha1 = createHash('md5').update(`${o.auth.user}:${REALM}:${o.auth.password}`).digest('hex');
    await writeFile(join(dir, 'digest-passwd'), `${o.auth.user}:${REALM}:${ha1}\n`, { mode: 0o600 });
    files.push(join(dir, 'passwd'), join(dir, 'digest-passwd'));
  }
  if (o.tls) {
    // Copies, so the unprivileged squid can read them wherever the originals live.
    await copyFile(o.tls.cert, join(dir, 'tls-cert.pem'));
    await copyFile(o.tls.key, join(dir, 'tls-key.pem'));
    files.push(join(dir, 'tls-cert.pem'), join(dir, 'tls-key.pem'));
  }
  if (o.bump) {
    await copyFile(o.bump.caCert, join(dir, 'bump-ca.pem'));
    await copyFile(o.bump.caKey, join(dir, 'bump-ca.key'));
    files.push(join(dir, 'bump-ca.pem'), join(dir, 'bump-ca.key'));
    if (o.bump.upstreamCa) {
      await copyFile(o.bump.upstreamCa, join(dir, 'upstream-ca.pem'));
      files.push(join(dir, 'upstream-ca.pem'));
    }
    await run(CERTGEN, ['-c', '-s', join(dir, 'ssl_db'), '-M', '4MB']);
  }
  const owner = proxyUser();
  if (owner) for (const f of [dir, ...files]) await chown(f, owner.uid, owner.gid);
  if (owner && o.bump) await run('chown', ['-R', `${owner.uid}:${owner.gid}`, join(dir, 'ssl_db')]);

  const inNetns = o.netns ? ['ip', 'netns', 'exec', o.netns] : [];
  const [command, ...args] = [...(o.launcher ?? []), ...inNetns, SQUID, ...squidArgs(dir)];
  const child = spawn(command!, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...o.env } });
  running.add(child);
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.once('error', () => resolve());
  });
  exited.then(() => running.delete(child));
  const isRunning = () => child.exitCode === null && child.signalCode === null && child.pid !== undefined;

  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    if (isRunning()) {
      child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(killer);
    }
    await rm(dir, { recursive: true, force: true });
  };

  const cacheLogPath = join(dir, 'cache.log');
  try {
    for (;;) {
      if (!isRunning()) throw new Error(`squid exited during startup (code ${child.exitCode}, signal ${child.signalCode})`);
      if (await listening(cacheLogPath, host, [port, httpsPort])) break;
      if (Date.now() > deadline) throw new Error(`squid did not accept connections on ${host}:${port} in time`);
      await sleep(50);
    }
  } catch (err) {
    const errStream = child.stderr!; // let the last stderr bytes arrive
    if (!isRunning() && !errStream.closed) await Promise.race([new Promise((r) => errStream.once('close', r)), sleep(500)]);
    const detail = `${(err as Error).message}\n--- cache.log tail ---\n${await tail(cacheLogPath)}\n--- stderr ---\n${stderr}`;
    await stop();
    throw new Error(detail);
  }

  const accessLogPath = join(dir, 'access.log');
  const readAccessLog = async (): Promise<string[]> => {
    if (!existsSync(accessLogPath)) return [];
    const lines = (await readFile(accessLogPath, 'utf8')).split('\n');
    return lines.filter((l) => l.trim() !== '' && l.split(' ')[1] !== PROBE_SOURCE);
  };
  const readAuthLog = async (): Promise<string[]> => {
    const path = join(dir, 'auth.log');
    if (!existsSync(path)) return [];
    // Squid logs the whole header value, URL-encoded ("Digest%20username=..."): only the scheme is kept. Lines
    // without a request (the readiness probes') are dropped.
    return (await readFile(path, 'utf8'))
      .split('\n')
      .map((l) => l.split(' '))
      .filter(([method]) => method !== undefined && method !== '' && method !== '-')
      .map(([method, url, status, auth]) => `${method} ${url} ${status} ${(auth ?? '-').split('%20')[0]}`);
  };
  const waitForAccessLog = async (predicate: (line: string) => boolean, timeoutMs = 10_000): Promise<string> => {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const lines = await readAccessLog();
      const hit = lines.find(predicate);
      if (hit !== undefined) return hit;
      if (Date.now() > until) {
        throw new Error(`no matching squid access log line within ${timeoutMs} ms; log:\n${lines.slice(-20).join('\n')}`);
      }
      await sleep(50);
    }
  };

  return {
    host,
    port,
    url: `http://${bracket(host)}:${port}`,
    ...(httpsPort ? { httpsPort, httpsUrl: `https://${host}:${httpsPort}` } : {}),
    pid: child.pid!,
    dir,
    accessLogPath,
    cacheLogPath,
    readAccessLog,
    readAuthLog,
    waitForAccessLog,
    stop,
  };
}
