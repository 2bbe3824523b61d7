/**
 * The SSH Service: an SSH server (ssh2) on the agent, reached through the reverse tunnel (and, with
 * ssh_service.listen_addr, directly on 3022 for self-hosted clusters where the Proxy dials agents).
 *
 * - Host key: the agent's host key, which its host certificate (signed by the cluster's host CA, principals:
 *   host ID, node name, every public_addr) certifies. ssh2 cannot present the certificate itself in the key
 *   exchange, so clients learn the key through `gwsh known-hosts`, which checks that certificate first.
 * - Users: only OpenSSH user certificates from the cluster's user CA get in. The login asked for must be one
 *   of the certificate's principals (the roles' `logins`); the certificate must be valid now. Which nodes a user
 *   may reach (labels) is decided by the Proxy before the connection reaches this server.
 * - Sessions: exec, an interactive shell with a pseudo-terminal (window changes, exit status and signals),
 *   env requests, the sftp subsystem, scp, and direct-tcpip (-L) when the certificate carries
 *   permit-port-forwarding. Commands run as the requested OS user.
 * - sftp: this program itself (`gateway sftp-server`, src/agent/sftp/) run as the OS user like any command, so
 *   nothing beyond the gateway has to be installed; or the system's sftp-server when one is configured.
 * - Every session is an audit event (who, node, login, start, end, exit code), sent to the Proxy.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, statSync, writeSync } from 'node:fs';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { fileURLToPath } from 'node:url';
import ssh2 from 'ssh2';
import type { Connection, ServerChannel } from 'ssh2';
import { sshPrivateKeyPem } from '../auth/pki.js';
import { Backoff, type BackoffPolicy } from '../backoff.js';
import { checkUserCertAuth } from '../auth/sshauth.js';
import { ptyMaster } from '../internals.js';
import { logger } from '../log.js';
import { connectionOf } from '../net/deadlines.js';
import { streamOf } from '../net/ssh.js';
import { StreamMeta } from '../stream/meta.js';

export interface SessionEvent {
  event: 'session.start' | 'session.end';
  user: string;
  login: string;
  node: string;
  session: string;
  kind: 'exec' | 'shell' | 'subsystem';
  command?: string;
  exit_code?: number;
  signal?: string;
  client?: string;
  time: string;
}

export interface SshServiceOptions {
  hostKeyPem: string;
  /** The cluster's user CA (OpenSSH public key line). */
  userCa: string;
  nodename: string;
  onEvent?: (event: SessionEvent) => void;
  clock?: () => number;
  /** The system's sftp-server to run for the sftp subsystem; unset: the built-in one. */
  sftpServer?: string | undefined;
}

/**
 * The first directory on the way to path (or path itself) that other users cannot enter or read, if any: where the
 * built-in sftp server, run as the login user, would fail to start (a checkout under /root, mode 0700).
 */
export function unreadableByOthers(path: string): string | undefined {
  const parts = path.split('/').filter(Boolean);
  for (let i = 1; i <= parts.length; i++) {
    const p = `/${parts.slice(0, i).join('/')}`;
    try {
      const mode = statSync(p).mode;
      const needed = i === parts.length ? 0o004 : 0o001;
      if ((mode & needed) === 0) return p;
    } catch {
      return p;
    }
  }
  return undefined;
}

/** The built-in sftp-server: this program (dist/cli/gateway.js next to dist/agent/) with its hidden subcommand. */
const BUILTIN_SFTP_SERVER = [process.execPath, fileURLToPath(new URL('../cli/gateway.js', import.meta.url)), 'sftp-server'];

interface PasswdEntry {
  uid: number;
  gid: number;
  home: string;
  shell: string;
}

function lookupUser(login: string): PasswdEntry | undefined {
  for (const line of readFileSync('/etc/passwd', 'utf8').split('\n')) {
    const f = line.split(':');
    if (f[0] === login && f.length >= 7) return { uid: Number(f[2]), gid: Number(f[3]), home: f[5]!, shell: f[6]! || '/bin/sh' };
  }
  return undefined;
}

const SIGNALS = new Set(['ABRT', 'ALRM', 'FPE', 'HUP', 'ILL', 'INT', 'KILL', 'PIPE', 'QUIT', 'SEGV', 'TERM', 'USR1', 'USR2']);

let sessionSeq = 0;

/** The client address (as the Proxy saw it) of each connection that came through the reverse tunnel. */
const tunnelClients = new StreamMeta<string>();
/** Sockets of the direct listener (src/agent/direct.ts): their handshake deadline ends when the client is in. */
const directSockets = new WeakSet<Duplex>();

export class SshService {
  private readonly server: ssh2.Server;
  private readonly log = logger('ssh');

  constructor(private readonly options: SshServiceOptions) {
    this.server = new ssh2.Server({ hostKeys: [sshPrivateKeyPem(options.hostKeyPem)], ident: 'gateway-ssh' }, (conn, info) => this.onConnection(conn, info));
    if (!options.sftpServer) {
      const hidden = unreadableByOthers(BUILTIN_SFTP_SERVER[1]!);
      if (hidden) {
        this.log.warn(
          { program: BUILTIN_SFTP_SERVER[1], not_readable: hidden },
          'sftp and scp will fail: the built-in sftp server runs this program as the login user, who cannot read it; install the gateway where every user can read it (e.g. /usr/local/lib/gateway), or set ssh_service.sftp_server',
        );
      }
    }
  }

  /** A connection that arrived through the reverse tunnel; client: its address as the Proxy saw it. */
  inject(stream: Duplex, client?: string): void {
    if (client !== undefined) tunnelClients.set(stream, client);
    this.server.injectSocket(stream as never);
  }

  /**
   * A connection accepted by the direct listener of an agent that joined the Auth Service directly (a guarded
   * socket after mutual TLS with a Proxy and its dial request, src/agent/direct.ts): it must finish the SSH
   * handshake and authenticate within handshakeMs; client: the user's address as the Proxy saw it.
   */
  injectDirect(socket: Duplex, handshakeMs: number, client?: string): void {
    if (client !== undefined) tunnelClients.set(socket, client);
    directSockets.add(socket);
    connectionOf(socket).enter('ssh-handshake', handshakeMs);
    this.server.injectSocket(socket as never);
  }

  close(): void {
    this.server.close();
  }

  private now(): number {
    return (this.options.clock ?? Date.now)();
  }

  private onConnection(conn: Connection, info: { ip: string; port: number }): void {
    const stream = streamOf(conn);
    const client = (stream && tunnelClients.get(stream)) ?? `${info.ip}:${info.port}`;
    if (stream && directSockets.has(stream)) conn.once('ready', () => connectionOf(stream).leave('ssh-handshake'));
    let user = '';
    let login = '';
    let portForwarding = false;

    conn.on('authentication', (ctx) => {
      if (ctx.method !== 'publickey') return ctx.reject(['publickey']);
      const check = checkUserCertAuth(ctx, this.options.userCa, this.now(), ctx.username);
      if (!check.ok) {
        if (!check.cert) this.log.info({ client, login: ctx.username, why: check.why }, `refused ${check.why}`);
        else this.log.info({ client, user: check.cert.keyId, login: ctx.username, why: check.why }, 'SSH login refused');
        return ctx.reject(['publickey']);
      }
      if (check.query) return ctx.accept();
      if (!lookupUser(ctx.username)) {
        this.log.info({ client, user: check.cert.keyId, login: ctx.username }, 'SSH login refused: no such OS user on this node');
        return ctx.reject(['publickey']);
      }
      user = check.cert.keyId;
      login = ctx.username;
      portForwarding = check.cert.extensions.includes('permit-port-forwarding');
      ctx.accept();
    });

    conn.on('ready', () => {
      this.log.info({ client, user, login }, 'SSH login');
      conn.on('session', (accept) => this.onSession(accept(), user, login, client));
      conn.on('tcpip', (accept, reject, dest) => {
        if (!portForwarding) {
          this.log.info({ user, login, dest: `${dest.destIP}:${dest.destPort}` }, 'port forwarding refused: not permitted by the certificate');
          return reject();
        }
        const socket = net.connect({ host: dest.destIP, port: dest.destPort, allowHalfOpen: true });
        socket.once('connect', () => {
          const channel = accept();
          channel.pipe(socket).pipe(channel);
          socket.once('error', () => channel.destroy());
          channel.once('error', () => socket.destroy());
        });
        socket.once('error', () => reject());
      });
    });
    conn.on('error', (err) => this.log.debug({ client, err: err.message }, 'SSH connection error'));
  }

  private onSession(session: ssh2.Session, user: string, login: string, client: string): void {
    const state: SessionState = { user, login, client, env: {}, pty: undefined, running: undefined };
    session.on('pty', (accept, _reject, info) => {
      state.pty = { term: info.term || 'xterm', cols: info.cols || 80, rows: info.rows || 24 };
      accept?.();
    });
    session.on('window-change', (accept, _reject, info) => {
      if (state.pty) {
        state.pty.cols = info.cols;
        state.pty.rows = info.rows;
      }
      state.running?.resize?.(info.cols, info.rows);
      accept?.();
    });
    session.on('env', (accept, reject, info) => {
      // Like OpenSSH's AcceptEnv LANG LC_*: only locale settings and our own variables.
      if (/^(LANG|LC_[A-Z_]+|GATEWAY_[A-Z_]+)$/.test(info.key)) {
        state.env[info.key] = info.val;
        accept?.();
      } else reject?.();
    });
    session.on('signal', (accept, _reject, info) => {
      if (SIGNALS.has(info.name)) state.running?.kill(`SIG${info.name}`);
      accept?.();
    });
    session.on('exec', (accept, _reject, info) => {
      const channel = accept();
      const account = lookupUser(login)!;
      this.startSession(state, 'exec', channel, info.command, [account.shell, '-c', info.command]);
    });
    session.on('shell', (accept) => {
      const channel = accept();
      const account = lookupUser(login)!;
      this.startSession(state, 'shell', channel, undefined, [account.shell, '-l']);
    });
    session.on('subsystem', (accept, reject, info) => {
      if (info.name !== 'sftp') return reject?.();
      const channel = accept();
      this.startSession(state, 'subsystem', channel, 'sftp', this.options.sftpServer ? [this.options.sftpServer] : BUILTIN_SFTP_SERVER);
    });
  }

  /** Runs argv as the login user for one session channel: audited at start and end, in a pty when one was asked for. */
  private startSession(state: SessionState, kind: SessionEvent['kind'], channel: ServerChannel, command: string | undefined, argv: string[]): void {
    const id = `${Date.now().toString(36)}-${(++sessionSeq).toString(36)}`;
    const account = lookupUser(state.login)!;
    const base = { user: state.user, login: state.login, node: this.options.nodename, session: id, kind, ...(command ? { command } : {}), client: state.client };
    this.options.onEvent?.({ event: 'session.start', ...base, time: new Date(this.now()).toISOString() });
    const finish: Finish = (code, signal) => {
      if (signal) channel.exit(signal.replace(/^SIG/, ''), false, '');
      else channel.exit(code ?? 0);
      channel.end();
      this.options.onEvent?.({ event: 'session.end', ...base, ...(code === null ? {} : { exit_code: code }), ...(signal ? { signal } : {}), time: new Date(this.now()).toISOString() });
    };
    const env = sessionEnv(state, account);
    if (state.pty) runInPty(channel, argv, account, env, state.pty, finish, (r) => (state.running = r));
    else state.running = runWithPipes(channel, argv, account, env, finish);
  }
}

interface Running {
  resize?: (cols: number, rows: number) => void;
  kill: (signal: string) => void;
}
type Finish = (code: number | null, signal: string | null) => void;

/** What the requests of one session (pty, env, signals) have set, shared by its exec/shell/subsystem. */
interface SessionState {
  user: string;
  login: string;
  client: string;
  env: Record<string, string>;
  pty: { term: string; cols: number; rows: number } | undefined;
  running: Running | undefined;
}

/** The environment a session's command gets: the client's accepted variables, then the login's own. */
function sessionEnv(state: SessionState, account: PasswdEntry): Record<string, string> {
  return {
    ...state.env,
    HOME: account.home,
    USER: state.login,
    LOGNAME: state.login,
    SHELL: account.shell,
    PATH: '/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin',
    ...(state.pty ? { TERM: state.pty.term } : {}),
    SSH_CLIENT: state.client.replace(/:(\d+)$/, ' $1 22'),
  };
}

/** Bytes waiting for the terminal beyond which the session's channel is paused (its window then holds the client back). */
const PTY_QUEUE_MAX = 64 * 1024;
/**
 * Retrying while the terminal's input buffer stays full (its program is not reading): 1 ms, doubling to 100 ms,
 * back to 1 ms whenever a write makes progress. No jitter: a local descriptor, nobody else retries it.
 */
export const PTY_RETRY: BackoffPolicy = { firstMs: 1, maxMs: 100, jitter: 'none' };

/**
 * Writes to a pty's master descriptor (non-blocking, set so by node-pty) in this thread, at once: node-pty's own
 * write goes through libuv's thread pool for every write, a thread wake-up for each keystroke and a second one to
 * report back (measured with bench:ssh's BENCH_TRACE). When the terminal's input buffer is full (EAGAIN, a program
 * that does not read), the rest waits, in order, and is retried after PTY_RETRY; past PTY_QUEUE_MAX the
 * source is paused until everything is written. Other errors (EIO once the program has gone) drop the input, as
 * the terminal would.
 */
export class PtyWriter {
  private queue: Buffer[] = [];
  private queued = 0;
  private readonly retry = new Backoff(PTY_RETRY);
  /** A flush is scheduled. */
  private waiting = false;
  private broken = false;

  /** fd: the master descriptor while it is open, else undefined (see ptyFd). */
  constructor(
    private readonly fd: () => number | undefined,
    private readonly source: { pause(): unknown; resume(): unknown },
  ) {}

  write(data: Buffer): void {
    if (this.broken || data.length === 0) return;
    if (this.queue.length === 0) {
      const n = this.tryWrite(data);
      if (n === data.length || this.broken) return;
      data = data.subarray(n);
    }
    this.queue.push(data);
    this.queued += data.length;
    if (this.queued > PTY_QUEUE_MAX) this.source.pause();
    if (!this.waiting) this.schedule();
  }

  close(): void {
    this.retry.stop();
    this.broken = true;
    this.queue = [];
    this.queued = 0;
  }

  private schedule(): void {
    this.waiting = true;
    this.retry.schedule(() => this.flush());
  }

  private flush(): void {
    this.waiting = false;
    let progressed = false;
    while (this.queue.length > 0 && !this.broken) {
      const head = this.queue[0]!;
      const n = this.tryWrite(head);
      this.queued -= n;
      progressed ||= n > 0;
      if (n < head.length) {
        this.queue[0] = head.subarray(n);
        if (progressed) this.retry.reset();
        this.schedule();
        return;
      }
      this.queue.shift();
    }
    this.retry.reset();
    this.source.resume();
  }

  /** Bytes written (0 when the terminal is full). */
  private tryWrite(data: Buffer): number {
    const fd = this.fd();
    if (fd === undefined) {
      this.close();
      return 0;
    }
    try {
      return writeSync(fd, data);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EAGAIN') return 0;
      this.close();
      return 0;
    }
  }
}

/**
 * The master descriptor of node-pty's terminal while it is open, or undefined once closed, so that a write never
 * goes to a number the process has meanwhile reused for another file (src/internals.ts ptyMaster: how it is
 * known). Undefined as a whole when node-pty does not look as expected (its own write is then used).
 */
function ptyFd(term: unknown): (() => number | undefined) | undefined {
  const master = ptyMaster(term);
  if (!master) return undefined;
  return () => (master.isOpen() ? master.fd : undefined);
}

/** The command in a pseudo-terminal (node-pty): resized with the window, hung up when the client goes away. */
function runInPty(channel: ServerChannel, argv: string[], account: PasswdEntry, env: Record<string, string>, pty: NonNullable<SessionState['pty']>, finish: Finish, onRunning: (r: Running) => void): void {
  let channelClosed = false;
  channel.once('close', () => (channelClosed = true));
  void import('node-pty').then(({ spawn: spawnPty }) => {
    // encoding null: bytes both ways, as they came (a multi-byte character split across two reads or two SSH
    // packets is the client's and the program's to join), and no decoding and encoding again per read.
    const term = spawnPty(argv[0]!, argv.slice(1), { name: pty.term, cols: pty.cols, rows: pty.rows, cwd: account.home, env, uid: account.uid, gid: account.gid, encoding: null });
    let exited = false;
    onRunning({ resize: (c, r) => term.resize(c, r), kill: (s) => term.kill(s) });
    term.onData((d: string | Buffer) => channel.write(d));
    const fd = ptyFd(term);
    const writer = fd ? new PtyWriter(fd, channel) : undefined;
    channel.on('data', (d: Buffer) => (writer ? writer.write(d) : term.write(d as unknown as string)));
    term.onExit(({ exitCode, signal }) => {
      exited = true;
      writer?.close();
      finish(signal ? null : exitCode, signal ? signalName(signal) : null);
    });
    // The client went away (connection lost, ssh killed) while the session runs: hang up, as the kernel does
    // for sshd when it closes the terminal; otherwise the shell and its jobs would outlive the session.
    const hangUp = () => {
      writer?.close();
      if (!exited) term.kill('SIGHUP');
    };
    if (channelClosed) hangUp();
    else channel.once('close', hangUp);
  });
}

/** The command with pipes: the session ends when it has exited and both its outputs have ended. */
function runWithPipes(channel: ServerChannel, argv: string[], account: PasswdEntry, env: Record<string, string>, finish: Finish): Running {
  const child: ChildProcess = spawn(argv[0]!, argv.slice(1), { cwd: account.home, env, uid: account.uid, gid: account.gid, stdio: ['pipe', 'pipe', 'pipe'] });
  channel.pipe(child.stdin!);
  child.stdout!.pipe(channel, { end: false });
  child.stderr!.pipe(channel.stderr, { end: false });
  child.once('error', (err) => {
    channel.stderr.write(`gateway: cannot start ${argv[0]}: ${err.message}\n`);
    finish(127, null);
  });
  let outputs = 2;
  let exit: [number | null, string | null] | undefined;
  const maybeFinish = () => {
    if (outputs === 0 && exit) finish(exit[0], exit[1]);
  };
  for (const out of [child.stdout!, child.stderr!]) {
    out.once('end', () => {
      outputs--;
      maybeFinish();
    });
  }
  child.once('exit', (code, signal) => {
    exit = [code, signal];
    maybeFinish();
  });
  // The client went away while the command runs: close its pipes, as sshd does (its next write gets SIGPIPE).
  channel.once('close', () => {
    if (exit) return;
    child.stdin!.destroy();
    child.stdout!.destroy();
    child.stderr!.destroy();
    // Destroyed pipes never end: the session ends (and is audited) when the command exits.
    outputs = 0;
    maybeFinish();
  });
  return { kill: (s) => child.kill(s as NodeJS.Signals) };
}

function signalName(n: number): string {
  const names: Record<number, string> = { 1: 'SIGHUP', 2: 'SIGINT', 3: 'SIGQUIT', 6: 'SIGABRT', 9: 'SIGKILL', 13: 'SIGPIPE', 14: 'SIGALRM', 15: 'SIGTERM' };
  return names[n] ?? 'SIGTERM';
}
