#!/usr/bin/env node
// Automatic agent upgrader for systemd Linux hosts (docs/upgrades.md). Driven by gateway-upgrade.timer; the
// commands below are also what an operator runs by hand. Results on standard output, warnings on standard error.
import { Writable } from 'node:stream';
import { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import { createLogger, setRootLogger, type LogLevel } from '../log.js';
import { recordingLastRun } from '../upgrade/lastrun.js';
import { resolveSettings } from '../upgrade/settings.js';
import { dryRun, runUpgrade, setRepoChannel, setRepoSource, showRepo, type UpgraderContext } from '../upgrade/upgrader.js';
import { formatOf, formatOption, render, type Format, type FormatOptions } from './output.js';
import { newProgram, runCli, VERSION } from './run.js';
import { addCompletionCommands } from './completion.js';
import { PROXY_ENVIRONMENT } from './manpage.js';

const program = newProgram('gateway-upgrade', 'Automatic agent upgrader for systemd Linux hosts (apt, yum, dnf, zypper or tarball installs).');

/** Discards what it is given: with --format json or yaml the report is printed whole at the end instead of the lines. */
const discard = new Writable({ write: (_chunk, _enc, done) => done() });

function context(format: Format = 'text'): UpgraderContext {
  const debug = program.opts<{ debug?: boolean }>().debug === true;
  setRootLogger(createLogger({ level: debug ? 'debug' : ((process.env.GATEWAY_LOG_LEVEL as LogLevel | undefined) ?? 'warn') }));
  return { settings: resolveSettings(process.env), dialer: new Dialer(), stdout: format === 'text' ? process.stdout : discard, stderr: process.stderr };
}

formatOption(program
  .command('dry-run')
  .description("ask the Proxy's rollout (else the version server) and report whether an upgrade is available, and why or when"))
  .action(async (opts: FormatOptions) => {
    const format = formatOf(opts);
    const report = await dryRun(context(format));
    if (format !== 'text') process.stdout.write(render(format, report, () => ''));
  });

program
  .command('run')
  .description("upgrade now if the Proxy's rollout says so; without a rollout, if the versions differ and the release is critical or a maintenance window is open")
  .option('--update-repo', 'move a per-major repository (stable/v<N>) to the target major version when needed')
  .action(async (opts: { updateRepo?: boolean }) => {
    const ctx = context();
    await recordingLastRun(ctx.settings.etcDir, (onVersions, onRollout) => runUpgrade(ctx, { updateRepo: opts.updateRepo === true, onVersions, onRollout }));
  });

formatOption(program
  .command('version')
  .description("print gateway-upgrade's own version"))
  .action((opts: FormatOptions) => {
    process.stdout.write(render(formatOf(opts), { version: VERSION }, () => `gateway-upgrade v${VERSION}`));
  });

const repo = program.command('repo').description('the package repository entry (gateway.list / gateway.repo)');
repo.action(() => {
  repo.outputHelp();
});
formatOption(repo
  .command('show')
  .description('print the repository entry and its channel'))
  .action(async (opts: FormatOptions) => {
    const format = formatOf(opts);
    const entry = await showRepo(context(format));
    if (format !== 'text') process.stdout.write(render(format, entry, () => ''));
  });
repo
  .command('set-channel')
  .description('move the repository entry to a channel: stable/v<major> or stable/rolling (created when missing)')
  .argument('<channel>', 'stable/v<major> or stable/rolling')
  .action(async (channel: string) => {
    await setRepoChannel(context(), channel);
  });
repo
  .command('set-source')
  .description("fetch packages through the endpoint file's Proxy (proxy) or from the repository's own address (direct); apt and dnf then trust the cluster's CA for the Proxy only")
  .argument('<source>', 'proxy or direct')
  .option('--ca-file <path>', "the CA the Proxy's certificate chains to (default: the agent's host CA, <data_dir>/host/host-ca.pem)")
  .action(async (source: string, opts: { caFile?: string }) => {
    if (source !== 'proxy' && source !== 'direct') throw new GatewayError('GW_ERR_USAGE', `unknown source '${source}'`, { hint: 'Give proxy or direct.' });
    await setRepoSource(context(), source, opts.caFile);
  });

// No subcommand: the usage, on standard output, status 0 (as before the subcommands existed).
program.usage('[options] [command]').argument('[command]').action((command: string | undefined) => {
  if (command !== undefined) {
    throw new GatewayError('GW_ERR_USAGE', `unknown command '${command}'`, { hint: "Commands: dry-run, run, version, repo show, repo set-channel, repo set-source, completion. Run 'gateway-upgrade --help'." });
  }
  program.outputHelp();
});

addCompletionCommands(program, {
  description: ['gateway-upgrade.timer runs gateway-upgrade run every 30 minutes: it asks the version server named in the endpoint file, and installs the channel\'s version inside a maintenance window (at once when critical). docs/upgrades.md describes it and every setting.'],
  environment: [
    ...PROXY_ENVIRONMENT,
    ['GATEWAY_UPGRADE_CA_FILE', 'Extra trusted CA files for the version server (colon-separated).'],
    ['GATEWAY_UPGRADE_PACKAGE_MANAGER', 'apt, yum, dnf, zypper or tarball, instead of detecting it.'],
    ['GATEWAY_UPGRADE_DOWNLOAD_URL', 'Where release tarballs are downloaded from.'],
    ['GATEWAY_UPGRADE_DATA_DIR', 'The agent\'s data directory (its host ID, its cluster CA).'],
    ['GATEWAY_UPGRADE_ARTIFACTS', "proxy: release tarballs (and new repository entries) through the endpoint file's Proxy; direct (default)."],
    ['GATEWAY_UPGRADE_*', 'The other settings: docs/upgrades.md, "Settings".'],
  ],
  files: [
    ['/etc/gateway-upgrade.d/endpoint', 'The version server: <host:port>/v1/webapi/automaticupgrades/channel/<channel>.'],
    ['/etc/gateway-upgrade.d/schedule', 'The maintenance windows the agent exports.'],
    ['/etc/gateway-upgrade.d/group', 'Optional: the rollout group asked for this host (else the agent\'s own).'],
    ['/var/lib/gateway/host/identity.json', 'The agent\'s identity: the host ID the rollout knows this host by.'],
    ['/etc/default/gateway', 'The environment of gateway-upgrade.service.'],
  ],
  seeAlso: ['gateway(1)', 'systemd.timer(5)'],
});

await runCli(program);
