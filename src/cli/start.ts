/**
 * `gateway start`: the configuration with the command line's flags, logging, the data-directory lock, the pid file,
 * SIGHUP reloads, then the daemon (src/daemon.ts) until SIGINT / SIGTERM. An agent drains on SIGTERM (with
 * gateway.drain_on_stop) and hands over
 * to a successor on SIGUSR2 (src/handover.ts); a second SIGTERM / SIGINT exits at once. src/cli/gateway.ts loads this module
 * only when `start` runs: it and what it imports are most of the code, which no other command needs.
 */
import { mkdirSync } from 'node:fs';
import { isAbsolute, join, resolve } from 'node:path';
import { destination } from 'pino';
import { parseAddr, type AddrError } from '../addr.js';
import { defaultConfig, loadConfigFile, type GatewayConfig } from '../config/index.js';
import { servicesFor, startDaemon, type Daemon, type StartFlags } from '../daemon.js';
import { GatewayError } from '../errors.js';
import { diagAddrOf } from './diagaddr.js';
import { ensurePrivateFile } from '../fsutil.js';
import { createLogger, logger, outlivingDestination, setRootLogger, survivingOutput, type LogLevel } from '../log.js';
import { acquireDataDirLock, acquirePidFile, channelsChanged, followLogLevel, installReload, trustedSourcesChanged, type PidFile } from '../reload.js';
import { daemonEnvironment } from '../roles/environment.js';
import { startBanner } from './banner.js';
import { Handover, HANDOVER_FROM_ENV, predecessorOf, startSuccessor, type Predecessor } from '../handover.js';
import type { AgentPool } from '../agent/pool.js';

export interface StartOptions {
  config?: string;
  roles?: string;
  token?: string;
  caPin?: string;
  proxy?: string;
  authServer?: string;
  dataDir?: string;
  publicAddr?: string;
  pidFile?: string;
  diagAddr?: string;
}

/** The configuration with --data-dir (an absolute path) and --public-addr (host[:port], 443 by default) applied. */
function withFlags(config: GatewayConfig, opts: StartOptions): GatewayConfig {
  let out = config;
  if (opts.dataDir !== undefined) {
    if (!isAbsolute(opts.dataDir)) {
      throw new GatewayError('GW_ERR_USAGE', `--data-dir: "${opts.dataDir}" is not an absolute path`, { hint: `Give the whole path, e.g. --data-dir=${resolve(opts.dataDir)}.` });
    }
    out = { ...out, gateway: Object.freeze({ ...out.gateway, data_dir: opts.dataDir }) };
  }
  if (opts.publicAddr !== undefined) {
    let addr: { host: string; port: number | undefined };
    try {
      addr = parseAddr(opts.publicAddr);
    } catch (err) {
      throw new GatewayError('GW_ERR_USAGE', `--public-addr: "${opts.publicAddr}" is not host[:port] (${(err as Error).message})`, {
        hint: (err as AddrError).hint ?? 'Give the DNS name or IP that agents and users dial, e.g. --public-addr=gateway.example.com:443.',
      });
    }
    const publicAddr = Object.freeze([Object.freeze({ host: addr.host, port: addr.port ?? 443 })]);
    out = { ...out, proxy_service: Object.freeze({ ...out.proxy_service, public_addr: publicAddr }) };
  }
  if (opts.diagAddr !== undefined) out = { ...out, gateway: Object.freeze({ ...out.gateway, diag_addr: diagAddrOf(opts.diagAddr) }) };
  return Object.freeze(out);
}

/** Where logs meant for a standard stream go once it is gone (docs/configuration.md, gateway.log.output). */
export const STDIO_LOG_FILE = 'gateway.log';

/** The `start` command: its options as commander gives them, and --debug. */
export async function runStart(opts: StartOptions, debug: boolean): Promise<void> {
  const load = (path: string | undefined): GatewayConfig => withFlags(path ? loadConfigFile(path) : defaultConfig(), opts);
  const config = load(opts.config);
  const { output, severity, format } = config.gateway.log;
  // A log file is private (0600) whatever the umask: log lines name users, addresses and resources.
  if (output !== 'stdout' && output !== 'stderr') ensurePrivateFile(output);
  // The daemon outlives its terminal (src/log.ts): logs to a standard stream go on in <data_dir>/gateway.log once
  // that stream has lost its reader, and a lost stream never ends the process.
  const outliving = (stream: NodeJS.WriteStream, name: string) =>
    outlivingDestination(stream, { name, fallbackPath: join(config.gateway.data_dir, STDIO_LOG_FILE), ensure: ensurePrivateFile });
  const root = createLogger({
    level: debug ? 'debug' : severity,
    ...(format === undefined ? {} : { format }),
    destination: output === 'stdout' ? outliving(process.stdout, 'standard output') : output === 'stderr' ? outliving(process.stderr, 'standard error') : destination({ dest: output, mkdir: true }),
  });
  for (const [stream, name] of [[process.stdout, 'standard output'], [process.stderr, 'standard error']] as const) {
    survivingOutput(stream, (code) => logger('gateway').warn({ stream: name, error: code }, `${name} is gone (${code}); the gateway keeps running`), (err) => logger('gateway').warn({ stream: name, err }, `cannot write to ${name}`));
  }
  const setLevel = followLogLevel(root); // before any child logger exists, so SIGHUP can change every one's level
  setRootLogger(root);
  await start(config, {
    ...(opts.roles ? { roles: opts.roles.split(',') } : {}),
    ...(opts.token ? { token: opts.token } : {}),
    ...(opts.caPin ? { caPin: opts.caPin } : {}),
    ...(opts.proxy ? { proxy: opts.proxy } : {}),
    ...(opts.authServer ? { authServer: opts.authServer } : {}),
  }, { configPath: opts.config, load, pidFile: opts.pidFile, setLevel: (level) => setLevel(debug ? 'debug' : level) });
}

/** What `start` adds for systemd (docs/systemd.md): the pid file and SIGHUP reloads of the -c file. */
interface RunOptions {
  configPath?: string | undefined;
  load?: (path: string) => GatewayConfig;
  pidFile?: string | undefined;
  setLevel?: (level: LogLevel) => void;
}

const STOP_DEADLINE_MS = 5_000;

/** Runs the configured services until SIGINT / SIGTERM; SIGHUP reloads the configuration (src/reload.ts). */
async function start(config: GatewayConfig, flags: StartFlags, run: RunOptions = {}): Promise<void> {
  const log = logger('gateway');
  const services = servicesFor(config, flags.roles);
  if (services.length === 0) {
    throw new GatewayError('GW_ERR_CONFIG_VALUE', 'the configuration enables no service, so there is nothing to start', {
      hint: 'Set enabled: yes in at least one service section, or remove the sections to get the defaults (auth + proxy).',
    });
  }
  try {
    mkdirSync(config.gateway.data_dir, { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new GatewayError('GW_ERR_CONFIG_VALUE', `cannot create data directory ${config.gateway.data_dir}: ${(err as Error).message}`, {
      hint: 'Set gateway.data_dir to a directory this user can write, or run as a user that can create it.',
      cause: err,
    });
  }
  // Signals first, so that a stop request during start-up is not lost.
  let stopRequested: ((signal: string) => void) | undefined;
  const stopped = new Promise<string>((resolve) => (stopRequested = resolve));
  // A second signal while stopping (or draining) means "now": exit at once instead of waiting for the graceful stop.
  let stopping = false;
  let handover: Handover | undefined; // once the daemon runs an agent's tunnels
  const onSignal = (signal: string) => {
    if (stopping) {
      log.warn({ signal }, 'second stop signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    handover?.draining();
    stopRequested?.(signal);
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGUSR2', () => void askHandover(handover, () => {
    if (stopping) return;
    stopping = true;
    stopRequested?.('handover');
  }));
  // A successor of a hand-over takes the lock and the pid file from its parent (src/handover.ts).
  const predecessor = predecessorOf(process.env, process.ppid);
  delete process.env[HANDOVER_FROM_ENV]; // not for the sessions' programs, nor for this process's own successor
  const takeFrom = predecessor ? { takeFrom: predecessor.pid } : {};
  const dataLock = acquireDataDirLock(config.gateway.data_dir, takeFrom);
  let pidFile: PidFile | undefined;
  try {
    pidFile = run.pidFile ? acquirePidFile(run.pidFile, takeFrom) : undefined;
  } catch (err) {
    dataLock.release();
    throw err;
  }
  let starting: Promise<Daemon> | undefined;
  const reloads = installReload({
    configPath: run.configPath,
    ...(run.load ? { load: run.load } : {}),
    running: config,
    onReload: async (next, plan) => {
      const daemon = await starting!;
      const parts = { channels: channelsChanged(plan), trustedSources: trustedSourcesChanged(plan) };
      if (parts.channels || parts.trustedSources) daemon.reload(next, parts); // first: it is the step that can refuse the new values
      if (plan.live.includes('gateway.log.severity')) run.setLevel?.(next.gateway.log.severity);
    },
  });
  // Until every service holds sockets open, this timer is what keeps the daemon's event loop alive.
  const alive = setInterval(() => undefined, 1 << 30);
  try {
    // The one place the daemon's environment variables are read (the Dialer keeps reading the proxy ones live).
    starting = startDaemon(config, flags, daemonEnvironment(process.env));
    const daemon = await starting;
    process.stdout.write(startBanner(config, daemon));
    log.info(
      { nodename: config.gateway.nodename, data_dir: config.gateway.data_dir, services: daemon.services, addresses: daemon.addresses, host_id: daemon.hostIdentity?.hostId, pid_file: pidFile?.path },
      'gateway started',
    );
    if (predecessor) void tellReady(predecessor, daemon.tunnelAgent);
    const pool = daemon.tunnelAgent;
    if (pool) handover = new Handover({ hold: (on) => pool.hold(on), release: () => daemon.releaseDiag(), startSuccessor: () => {
      log.info({ drain_limit_ms: config.gateway.drain_limit }, 'hand-over: starting the successor (the command as installed now)');
      return startSuccessor();
    } });
    const signal = await stopped;
    if (pool && ((signal === 'SIGTERM' && config.gateway.drain_on_stop) || signal === 'handover')) await drainSessions(pool, config.gateway.drain_limit, signal);
    log.info({ signal }, 'stopping');
    // Graceful, with a deadline: whatever still holds the process after it is logged and the process exits,
    // rather than waiting for a service manager's SIGKILL.
    const deadline = setTimeout(() => {
      // What still keeps the event loop alive, by kind (public API: TCPSocketWrap, Timeout, FSReqCallback...).
      log.warn({ open: process.getActiveResourcesInfo() }, `stop did not finish within ${STOP_DEADLINE_MS} ms; exiting`);
      process.exit(0);
    }, STOP_DEADLINE_MS);
    deadline.unref();
    await daemon.stop();
  } finally {
    reloads.close();
    pidFile?.release();
    dataLock.release();
    clearInterval(alive);
  }
}

/** SIGUSR2: a hand-over (src/handover.ts); onReady once the successor is ready (this process then drains). */
async function askHandover(handover: Handover | undefined, onReady: () => void): Promise<void> {
  const log = logger('gateway');
  if (!handover) {
    log.warn({ code: 'GW_ERR_HANDOVER_BUSY' }, 'hand-over refused: this process runs no agent tunnel (or is still starting); nothing was started');
    return;
  }
  log.info('hand-over asked (SIGUSR2)');
  const outcome = await handover.handOver();
  if (!outcome.ok) {
    log.warn({ code: outcome.error.code, hint: outcome.error.hint, err: outcome.error.message }, outcome.error.message);
    return;
  }
  log.info({ successor_pid: outcome.pid }, 'hand-over: the successor is ready; this process drains its sessions and exits');
  onReady();
}

/** The successor's side: "ready" to the predecessor once every tunnel of the pool is welcomed (at once without one). */
async function tellReady(predecessor: Predecessor, pool: AgentPool | undefined): Promise<void> {
  if (pool) {
    const up = () => pool.getState() === 'connected' && pool.links().length >= pool.size;
    await new Promise<void>((resolve) => {
      if (up()) return resolve();
      const check = () => {
        if (!up()) return;
        pool.off('links', check);
        pool.off('state', check);
        resolve();
      };
      pool.on('links', check);
      pool.on('state', check);
    });
  }
  logger('gateway').info({ predecessor_pid: predecessor.pid }, 'hand-over: tunnels welcomed; telling the process before that this one is ready');
  predecessor.ready();
}

/** SIGTERM or a finished hand-over: no new stream, the sessions in flight go on for at most limitMs. */
async function drainSessions(pool: AgentPool, limitMs: number, signal: string): Promise<void> {
  const log = logger('gateway');
  const why = signal === 'handover' ? 'handed over to the successor' : `${signal}: stopping`;
  log.info({ streams: pool.streams(), drain_limit_ms: limitMs }, `draining (${why}): the sessions in flight go on, new ones are refused; a second SIGTERM stops at once`);
  await pool.drainAll(limitMs, `draining the tunnel (${why})`);
  log.info('drained: every tunnel is closed');
}
