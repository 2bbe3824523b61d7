#!/usr/bin/env node
// The gateway daemon and its operator commands: start, configure, dial-plan.
import { mkdirSync } from 'node:fs';
import { formatHostPort } from '../addr.js';
import { defaultConfig, enabledServices, loadConfigFile, sampleConfig, type GatewayConfig } from '../config/index.js';
import { Dialer } from '../dial/dialer.js';
import type { ProxyDecision } from '../dial/select.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { destination } from 'pino';
import { createLogger, logger, setRootLogger } from '../log.js';
import { EXIT_FAILURE, newProgram, runCli } from './run.js';

const program = newProgram('gateway', 'Gateway daemon: runs the Auth Service, Proxy Service and agents.');

program
  .command('start')
  .description('start the services enabled in the configuration (auth + proxy with no configuration file)')
  .option('-c, --config <file>', 'YAML configuration file (see `gateway configure`)')
  .action(async (opts: { config?: string }) => {
    const config = opts.config ? loadConfigFile(opts.config) : defaultConfig();
    const { output, severity, format } = config.gateway.log;
    setRootLogger(
      createLogger({
        level: program.opts<{ debug?: boolean }>().debug ? 'debug' : severity,
        ...(format === undefined ? {} : { format }),
        destination: output === 'stdout' ? process.stdout : output === 'stderr' ? process.stderr : destination({ dest: output, mkdir: true }),
      }),
    );
    await start(config);
  });

program
  .command('configure')
  .description('print a commented sample configuration to standard output')
  .action(() => {
    process.stdout.write(sampleConfig());
  });

program
  .command('dial-plan')
  .description('explain how each target would be dialled under the current HTTPS_PROXY / HTTP_PROXY / NO_PROXY')
  .argument('<target...>', 'host:port (a dial of the gateway\'s own) or an http:// or https:// URL')
  .option('--json', 'one JSON object per target per line')
  .action((targets: string[], opts: { json?: boolean }) => {
    const dialer = new Dialer();
    let failed = false;
    for (const target of targets) {
      let decision: ProxyDecision;
      try {
        decision = dialer.plan(target);
      } catch (err) {
        failed = true;
        const e = toGatewayError(err);
        if (opts.json) process.stdout.write(`${JSON.stringify({ target, error: { code: e.code, message: e.message } })}\n`);
        else process.stdout.write(`${target}: error ${e.code}: ${e.message}\n  hint: ${e.hint}\n`);
        continue;
      }
      const proxy = decision.proxy?.display ?? null;
      if (opts.json) {
        process.stdout.write(`${JSON.stringify({ target, proxy, source: decision.source, reason: decision.reason })}\n`);
      } else {
        const how = proxy ? `through ${proxy}` : 'direct';
        const t = formatHostPort(decision.target.host, decision.target.port);
        process.stdout.write(`${target}: ${how} (to ${t}): ${decision.reason}\n`);
      }
    }
    if (failed) process.exitCode = EXIT_FAILURE;
  });

/** Runs the configured services until SIGINT / SIGTERM. */
async function start(config: GatewayConfig): Promise<void> {
  const log = logger('gateway');
  const services = enabledServices(config);
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
  // Until services hold sockets open, this timer is what keeps the daemon's event loop alive.
  const alive = setInterval(() => undefined, 1 << 30);
  const stopped = new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      log.info({ signal }, 'stopping');
      clearInterval(alive);
      resolve();
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
  log.info(
    { nodename: config.gateway.nodename, data_dir: config.gateway.data_dir, services },
    'configuration loaded; this build implements configuration and outbound dialing only, so no service listens yet',
  );
  await stopped;
}

await runCli(program);
