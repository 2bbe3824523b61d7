#!/usr/bin/env node
// The gateway daemon and its operator commands: start, configure, dial-plan (and the hidden sftp-server).
import { mkdirSync } from 'node:fs';
import { homedir } from 'node:os';
import { isAbsolute, resolve } from 'node:path';
import { ensurePrivateFile } from '../fsutil.js';
import { parseAddr } from '../addr.js';
import { defaultConfig, loadConfigFile, sampleConfig, type GatewayConfig } from '../config/index.js';
import { runSftpServer } from '../agent/sftp/server.js';
import { servicesFor, startDaemon, type Daemon, type StartFlags } from '../daemon.js';
import { daemonEnvironment } from '../roles/environment.js';
import { GatewayError } from '../errors.js';
import { destination } from 'pino';
import { createLogger, logger, setRootLogger } from '../log.js';
import { dialPlan, type DialPlanOptions } from './dialplan.js';
import { EXIT_FAILURE, newProgram, runCli } from './run.js';
import { acquireDataDirLock, acquirePidFile, channelsChanged, followLogLevel, installReload, type PidFile } from '../reload.js';
import { startBanner } from './banner.js';
import { formatUnits, systemdUnits, UNIT_NAMES, writeUnits, type UnitName } from '../upgrade/systemd.js';
import type { LogLevel } from '../log.js';

const program = newProgram('gateway', 'Gateway daemon: runs the Auth Service, Proxy Service and agents.');

program
  .command('start')
  .description('start the services enabled in the configuration (auth + proxy with no configuration file)')
  .option('-c, --config <file>', 'YAML configuration file (see `gateway configure`)')
  .option('--roles <roles>', 'run these roles instead of the configured ones: auth, proxy, node, db, app, kube, desktop')
  .option('--token <token>', 'join token (first start of an agent; see `gwctl tokens add`)')
  .option('--ca-pin <pin>', "the cluster's CA pin, sha256:<hex>, checked before the token is sent")
  .option('--proxy <host:port>', "the Proxy's web address to join through")
  .option('--auth-server <host:port>', "the Auth Service's API address: an agent joins through it instead of --proxy; a Proxy without the auth role uses it (comma-separated for several)")
  .option('--data-dir <dir>', "use this data directory instead of gateway.data_dir (every daemon on a machine needs its own)")
  .option('--public-addr <host:port>', "the Proxy's address as agents and users dial it (proxy_service.public_addr); its certificate names it")
  .option('--pid-file <file>', 'write the process id to this file and remove it on exit (the systemd unit uses /run/gateway.pid)')
  .action(async (opts: StartOptions) => {
    const load = (path: string | undefined): GatewayConfig => withFlags(path ? loadConfigFile(path) : defaultConfig(), opts);
    const config = load(opts.config);
    const { output, severity, format } = config.gateway.log;
    // A log file is private (0600) whatever the umask: log lines name users, addresses and resources.
    if (output !== 'stdout' && output !== 'stderr') ensurePrivateFile(output);
    const debug = program.opts<{ debug?: boolean }>().debug === true;
    const root = createLogger({
      level: debug ? 'debug' : severity,
      ...(format === undefined ? {} : { format }),
      destination: output === 'stdout' ? process.stdout : output === 'stderr' ? process.stderr : destination({ dest: output, mkdir: true }),
    });
    const setLevel = followLogLevel(root); // before any child logger exists, so SIGHUP can change every one's level
    setRootLogger(root);
    await start(config, {
      ...(opts.roles ? { roles: opts.roles.split(',') } : {}),
      ...(opts.token ? { token: opts.token } : {}),
      ...(opts.caPin ? { caPin: opts.caPin } : {}),
      ...(opts.proxy ? { proxy: opts.proxy } : {}),
      ...(opts.authServer ? { authServer: opts.authServer } : {}),
    }, { configPath: opts.config, load, pidFile: opts.pidFile, setLevel: (level) => setLevel(debug ? 'debug' : level) });
  });

interface StartOptions {
  config?: string;
  roles?: string;
  token?: string;
  caPin?: string;
  proxy?: string;
  authServer?: string;
  dataDir?: string;
  publicAddr?: string;
  pidFile?: string;
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
        hint: 'Give the DNS name or IP that agents and users dial, e.g. --public-addr=gateway.example.com:443.',
      });
    }
    const publicAddr = Object.freeze([Object.freeze({ host: addr.host, port: addr.port ?? 443 })]);
    out = { ...out, proxy_service: Object.freeze({ ...out.proxy_service, public_addr: publicAddr }) };
  }
  return Object.freeze(out);
}

program
  .command('configure')
  .description('print a commented sample configuration to standard output')
  .action(() => {
    process.stdout.write(sampleConfig());
  });

const install = program.command('install').description('files that run the gateway as a system service');

install
  .command('systemd')
  .description(`print the systemd units (${UNIT_NAMES.join(', ')}), or write them with --output; see docs/systemd.md`)
  .option('-o, --output <path>', 'write instead of printing: a directory (existing, or ending in /) gets every unit; a file gets the agent unit (or the --unit one) and the others go next to it')
  .option('--unit <name>', `only this unit: ${UNIT_NAMES.join(', ')}`)
  .option('--bin-dir <dir>', 'directory holding gateway and gateway-upgrade', '/usr/local/bin')
  .option('-c, --config <file>', 'the configuration file the agent unit starts with', '/etc/gateway.yaml')
  .option('--pid-file <file>', 'the pid file of the agent unit', '/run/gateway.pid')
  .option('--env-file <file>', 'the optional environment file (HTTPS_PROXY, NO_PROXY, ...)', '/etc/default/gateway')
  .option('--force', 'replace unit files that already exist')
  .action((opts: { output?: string; unit?: string; binDir: string; config: string; pidFile: string; envFile: string; force?: boolean }) => {
    let units = systemdUnits({ binDir: opts.binDir, configPath: opts.config, pidFile: opts.pidFile, environmentFile: opts.envFile });
    if (opts.unit !== undefined) {
      if (!(UNIT_NAMES as readonly string[]).includes(opts.unit)) {
        throw new GatewayError('GW_ERR_USAGE', `--unit: "${opts.unit}" is not one of the units`, { hint: `Units: ${UNIT_NAMES.join(', ')}.` });
      }
      units = units.filter((u) => u.name === (opts.unit as UnitName));
    }
    if (opts.output === undefined) {
      process.stdout.write(units.length === 1 ? units[0]!.content : formatUnits(units));
      return;
    }
    for (const path of writeUnits(opts.output, units, { force: opts.force === true })) process.stdout.write(`wrote ${path}\n`);
    process.stdout.write('next: systemctl daemon-reload && systemctl enable --now gateway.service gateway-upgrade.timer\n');
  });

// Not for people: the SSH Service runs it, as the login user, for the `sftp` subsystem (docs/ssh.md).
program
  .command('sftp-server', { hidden: true })
  .description('speak SFTP on standard input and output as the current user; paths are relative to $HOME')
  .action(async () => {
    const failure = await runSftpServer(process.stdin, process.stdout, { home: homedir() });
    if (failure) {
      throw new GatewayError('GW_ERR_SFTP_PROTOCOL', `sftp-server stopped: ${failure.message}`, { cause: failure });
    }
  });

program
  .command('dial-plan')
  .description('explain how each target would be dialled under the current HTTPS_PROXY / HTTP_PROXY / NO_PROXY')
  .argument('[target...]', 'host:port (a dial of the gateway\'s own) or an http:// or https:// URL')
  .option('--json', 'one JSON object per target per line')
  .option('--kube-api <url>', "also the Kubernetes Service's dial of this API server (kube_service.clusters[].api_server), with --cluster")
  .option('--cluster <name>', "the gateway cluster's name, which makes kube.<name>.local (with --kube-api)")
  .action((targets: string[], opts: DialPlanOptions) => {
    if (!dialPlan(targets, opts)) process.exitCode = EXIT_FAILURE;
  });

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
  // A second signal while stopping means "now": exit at once instead of waiting for the graceful stop.
  let stopping = false;
  const onSignal = (signal: string) => {
    if (stopping) {
      log.warn({ signal }, 'second stop signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    stopRequested?.(signal);
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  const dataLock = acquireDataDirLock(config.gateway.data_dir);
  let pidFile: PidFile | undefined;
  try {
    pidFile = run.pidFile ? acquirePidFile(run.pidFile) : undefined;
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
      if (channelsChanged(plan)) daemon.reload(next); // first: it is the step that can refuse the new values
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
    const signal = await stopped;
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

await runCli(program);
