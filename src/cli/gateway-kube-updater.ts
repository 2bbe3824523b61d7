#!/usr/bin/env node
// The Kubernetes agent updater (docs/kubernetes-updater.md): a controller that keeps the agent StatefulSet or
// Deployment on its channel's version, inside the exported maintenance windows, or, under a managed rollout, on
// the version the Proxy's instruction names for its group (--group; src/upgrade/kube/instruction.ts). The chart gateway-kube-agent
// runs it as a Deployment next to the agent. With --diag-addr it serves /healthz, /readyz and /metrics (its last
// reconciliation's result: src/metrics/upgrade.ts), since it has no agent beside it to export them.
import { readFileSync } from 'node:fs';
import { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import { createLogger, logger, setRootLogger, LOG_LEVELS, type LogLevel } from '../log.js';
import { ClientNodeKubeApi, loadKubeConfig } from '../upgrade/kube/client.js';
import { KubeUpdater, SCHEDULE_SECRET_KEY, channelUrl, channelVersionSource } from '../upgrade/kube/controller.js';
import { HOST_ID_SECRET_KEY, instructionSource, instructionUrl } from '../upgrade/kube/instruction.js';
import { UPGRADE_GROUP_PATTERN } from '../wire/autoupdate.js';
import { DEFAULT_CONTAINER, RESYNC_INTERVAL_MS, type WorkloadKind } from '../upgrade/kube/decide.js';
import { Option } from 'commander';
import { completeValues } from './cmdtree.js';
import { addCompletionCommands } from './completion.js';
import { PROXY_ENVIRONMENT } from './manpage.js';
import { newProgram, runCli } from './run.js';
import { diagAddrOf } from './diagaddr.js';
import { enableMetrics } from '../metrics/define.js';
import { startDiagServer } from '../net/diag.js';

const program = newProgram('gateway-kube-updater', 'Keeps the Kubernetes agent on the version of its release channel, inside the maintenance windows.');

interface Options {
  namespace?: string;
  agentName?: string;
  agentKind: string;
  container: string;
  proxyAddr?: string;
  channel: string;
  versionUrl?: string;
  scheduleSecret?: string;
  scheduleKey: string;
  group?: string;
  hostIdKey: string;
  caFile?: string;
  insecureSkipVerify?: boolean;
  kubeconfig?: string;
  once?: boolean;
  dryRun?: boolean;
  logLevel: string;
  diagAddr?: string;
}

function kindOf(text: string): WorkloadKind {
  const t = text.trim().toLowerCase();
  if (t === 'statefulset' || t === 'sts') return 'StatefulSet';
  if (t === 'deployment' || t === 'deploy') return 'Deployment';
  throw new GatewayError('GW_ERR_USAGE', `--agent-kind: "${text}" is not statefulset or deployment`);
}

/**
 * --group, else the agent's name with its dots as "-", cut to 32 characters (the chart's default is the release's name
 * made so): a Kubernetes name is lowercase letters, digits, "-" and ".", so only a --group given can be refused.
 */
function groupOf(given: string | undefined, agentName: string): string {
  const group = given ?? agentName.replaceAll('.', '-').slice(0, 32).replace(/-+$/, '');
  if (!UPGRADE_GROUP_PATTERN.test(group)) {
    throw new GatewayError('GW_ERR_USAGE', `--group: "${group}" is not a rollout group name ([a-z0-9-], 1 to 32 characters)`, { hint: 'Give --group (the chart: updater.group).' });
  }
  return group;
}

/** The pod's namespace: --namespace, POD_NAMESPACE (the chart sets it), or the service account's namespace file. */
function namespaceOf(given: string | undefined): string {
  if (given) return given;
  if (process.env.POD_NAMESPACE) return process.env.POD_NAMESPACE;
  try {
    return readFileSync('/var/run/secrets/kubernetes.io/serviceaccount/namespace', 'utf8').trim();
  } catch {
    throw new GatewayError('GW_ERR_USAGE', 'the namespace of the agent is unknown', { hint: 'Give --namespace (or set POD_NAMESPACE).' });
  }
}

program
  .option('-n, --namespace <ns>', "the agent's namespace (default: POD_NAMESPACE, or the pod's own namespace)")
  // Checked in the action, not with requiredOption: commander would then ask for it before `completion` and `man`.
  .option('--agent-name <name>', 'the agent StatefulSet or Deployment (required)')
  .addOption(completeValues(new Option('--agent-kind <kind>', 'statefulset or deployment').default('statefulset'), ['statefulset', 'deployment']))
  .option('--container <name>', "the agent's container in the pod template", DEFAULT_CONTAINER)
  .option('--proxy-addr <host:port>', "the Proxy's public web address; the version server is https://<proxy-addr>/v1/webapi/automaticupgrades/channel/<channel>")
  .option('--channel <name>', 'the release channel (chart value updater.releaseChannel)', 'default')
  .option('--version-url <url>', 'the channel URL itself, instead of --proxy-addr and --channel (…/channel/<channel>, no /version)')
  .option('--schedule-secret <name>', 'the Secret holding the exported maintenance schedule (default: <agent-name>-shared-state)')
  .option('--schedule-key <key>', 'its key', SCHEDULE_SECRET_KEY)
  .option('--group <name>', "this release's group in a managed rollout, [a-z0-9-]{1,32} (default: the agent's name, dots as -, cut to 32 characters; the chart: updater.group)")
  .option('--host-id-key <key>', "the key of the schedule Secret where the agent exports its host id (asked for with the group)", HOST_ID_SECRET_KEY)
  .option('--ca-file <file>', "a PEM CA trusted for the Proxy's certificate (besides the system's)")
  .option('--insecure-skip-verify', "do not verify the Proxy's certificate (tests only)")
  .option('--kubeconfig <file>', 'a kubeconfig; default: KUBECONFIG, ~/.kube/config, or the pod service account')
  .option('--once', 'reconcile once and exit (status 0 whatever the decision)')
  .option('--dry-run', 'decide and log, but never change the agent')
  .option('--diag-addr <host:port>', 'serve /healthz, /readyz and /metrics (the last reconciliation\'s result) on this address (port 3000 when left out); off by default')
  .addOption(completeValues(new Option('--log-level <level>', `one of ${LOG_LEVELS.join(', ')}`).default('info'), LOG_LEVELS))
  .action(async (opts: Options) => {
    if (opts.agentName === undefined) throw new GatewayError('GW_ERR_USAGE', "required option '--agent-name <name>' not specified", { hint: "Run 'gateway-kube-updater --help' for usage." });
    if (!(LOG_LEVELS as readonly string[]).includes(opts.logLevel)) throw new GatewayError('GW_ERR_USAGE', `--log-level: "${opts.logLevel}" is not a level`);
    const debug = program.opts<{ debug?: boolean }>().debug === true;
    setRootLogger(createLogger({ level: debug ? 'debug' : (opts.logLevel as LogLevel) }));
    if (!opts.versionUrl && !opts.proxyAddr) {
      throw new GatewayError('GW_ERR_USAGE', 'the version server is unknown', { hint: 'Give --proxy-addr host:port (the chart sets it from proxyAddr), or --version-url.' });
    }
    const baseUrl = opts.versionUrl ?? channelUrl(opts.proxyAddr!, opts.channel);
    const group = groupOf(opts.group, opts.agentName);
    const diagAddr = opts.diagAddr === undefined ? undefined : diagAddrOf(opts.diagAddr);
    // Recording is on only where the metrics are served (as the daemon's), before the first reconciliation.
    if (diagAddr) enableMetrics();
    const namespace = namespaceOf(opts.namespace);
    const api = new ClientNodeKubeApi(loadKubeConfig(opts.kubeconfig ? { kubeconfig: opts.kubeconfig } : {}));
    const dialer = new Dialer();
    const trust = {
      ...(opts.caFile ? { ca: readFileSync(opts.caFile, 'utf8') } : {}),
      ...(opts.insecureSkipVerify ? { rejectUnauthorized: false } : {}),
    };
    const updater = new KubeUpdater({
      api,
      target: { kind: kindOf(opts.agentKind), namespace, name: opts.agentName },
      container: opts.container,
      channel: channelVersionSource({ baseUrl, dialer, ...trust }),
      instruction: instructionSource({ url: instructionUrl(opts.proxyAddr ?? baseUrl), group, dialer, ...trust }),
      scheduleSecret: { name: opts.scheduleSecret ?? `${opts.agentName}-shared-state`, key: opts.scheduleKey, hostIdKey: opts.hostIdKey },
      dryRun: opts.dryRun === true,
      resyncMs: RESYNC_INTERVAL_MS,
    });
    const log = logger('kube-updater');
    log.info({ version_url: baseUrl, channel: opts.channel, group }, "asking the Proxy's managed rollout, else the version server");
    if (opts.once) {
      await updater.reconcile('manual');
      return;
    }
    // Ready as soon as it serves: whether the agent is up to date is its metric's to say, not a reason to restart it.
    const diag = diagAddr ? await startDiagServer(diagAddr, () => ({ status: 'ready', checks: [] })) : undefined;
    if (diag) log.info({ diag_addr: diag.address }, 'diagnostics listener started');
    const stopped = new Promise<string>((resolve) => {
      process.once('SIGINT', () => resolve('SIGINT'));
      process.once('SIGTERM', () => resolve('SIGTERM'));
    });
    await updater.start();
    const signal = await stopped;
    log.info({ signal }, 'stopping');
    updater.stop();
    await diag?.close();
  });

addCompletionCommands(program, {
  description: ['The chart gateway-kube-agent runs it next to the agent (docs/kubernetes-updater.md).'],
  environment: [...PROXY_ENVIRONMENT, ['POD_NAMESPACE', "The agent's namespace when --namespace is not given."], ['KUBECONFIG', 'A kubeconfig when --kubeconfig is not given (outside a pod).']],
  files: [['/var/run/secrets/kubernetes.io/serviceaccount', "The pod's service-account token, CA and namespace."]],
  seeAlso: ['gateway(1)'],
});

await runCli(program);