#!/usr/bin/env node
// The gateway daemon and its operator commands: start, configure, dial-plan (and the hidden sftp-server).
import { homedir } from 'node:os';
import { GatewayError } from '../errors.js';
import { parseDuration } from '../duration.js';
import type { DialPlanOptions } from './dialplan.js';
import { formatOption, type FormatSpec } from './output.js';
import { EXIT_FAILURE, newProgram, runCli } from './run.js';
import { addCompletionCommands } from './completion.js';
import { PROXY_ENVIRONMENT } from './manpage.js';
import type { StartOptions } from './start.js';
import { formatUnits, systemdUnits, UNIT_NAMES, writeUnits, type UnitName } from '../upgrade/systemd.js';

// Start-up time: each command loads what it runs, with import() in its action. `gateway start` is most of the
// code and loads, in turn, only the roles it runs (src/daemon.ts); `--help`, `configure`, `install` and the
// SFTP server (spawned for every SFTP session) load none of it.

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
  .option('--diag-addr <host:port>', 'serve /healthz, /readyz and /metrics (plain HTTP, no credentials) on this address (gateway.diag_addr); off by default, never on a public port')
  // Loaded only here: what `start` runs (the daemon, its roles, configuration and logging) is most of the code.
  .action(async (opts: StartOptions) => (await import('./start.js')).runStart(opts, program.opts<{ debug?: boolean }>().debug === true));

program
  .command('configure')
  .description('print a commented sample configuration to standard output')
  .action(async () => {
    process.stdout.write((await import('../config/index.js')).sampleConfig());
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
  .option('--drain-limit <duration>', "the agent's gateway.drain_limit: TimeoutStopSec is it plus a minute", '30m')
  .option('--force', 'replace unit files that already exist')
  .action((opts: { output?: string; unit?: string; binDir: string; config: string; pidFile: string; envFile: string; drainLimit: string; force?: boolean }) => {
    const drainLimitMs = parseDuration(opts.drainLimit, '--drain-limit');
    let units = systemdUnits({ binDir: opts.binDir, configPath: opts.config, pidFile: opts.pidFile, environmentFile: opts.envFile, drainLimitMs });
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
    const { runSftpServer } = await import('../agent/sftp/server.js');
    const failure = await runSftpServer(process.stdin, process.stdout, { home: homedir() });
    if (failure) {
      throw new GatewayError('GW_ERR_SFTP_PROTOCOL', `sftp-server stopped: ${failure.message}`, { cause: failure });
    }
  });

/** dial-plan's json is one object per target per line (it streams: a probe takes seconds); --json is its old spelling. */
const DIAL_PLAN_FORMAT: FormatSpec = { jsonFlag: true };

formatOption(program
  .command('dial-plan')
  .description('explain how each target would be dialled under the current HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY (and the PAC file they name)')
  .argument('[target...]', 'host:port (a dial of the gateway\'s own) or an http:// or https:// URL')
  .option('--kube-api <url>', "also the Kubernetes Service's dial of this API server (kube_service.clusters[].api_server), with --cluster")
  .option('--cluster <name>', "the gateway cluster's name, which makes kube.<name>.local (with --kube-api)")
  .option('--probe', 'also dial each target, open TLS and report the certificate that answers (the cluster\'s, or "inspected by" another CA)')
  .option('--ca <file>', "with --probe: the cluster's host CA (PEM) to compare with")
  .option('--data-dir <dir>', "with --probe: an agent's data directory, whose host CA is compared with")
  .option('--timeout <ms>', 'with --probe: the deadline of each probe (dial and handshake)', String(10_000)), DIAL_PLAN_FORMAT)
  .action(async (targets: string[], opts: DialPlanOptions) => {
    if (!(await (await import('./dialplan.js')).dialPlan(targets, opts))) process.exitCode = EXIT_FAILURE;
  });

addCompletionCommands(program, {
  description: ['One daemon runs any set of roles (auth, proxy and the agents) from one configuration file; docs/configuration.md describes it, docs/architecture.md the whole system.'],
  environment: [
    ...PROXY_ENVIRONMENT,
    ['GATEWAY_LOG_LEVEL', 'The log level when the configuration does not set gateway.log.severity.'],
  ],
  files: [
    ['/etc/gateway.yaml', 'The configuration (gateway start -c); gateway configure prints a sample.'],
    ['/var/lib/gateway', 'The data directory of root (gateway.data_dir): identities, the cluster state of an Auth Service, gateway.lock.'],
    ['/etc/default/gateway', "The environment of gateway.service (the packages' systemd unit)."],
  ],
  seeAlso: ['gwctl(1)', 'gwsh(1)', 'gateway-upgrade(1)'],
});

await runCli(program);
