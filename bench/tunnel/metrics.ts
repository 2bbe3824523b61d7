/**
 * BENCH_TUNNEL_ONLY=metrics: the cost of metrics on the data path, in one run. The gateway's path (client -> Proxy
 * -> tunnel through squid -> agent -> sink) is measured with its two daemons started without a diagnostics
 * listener (metrics off: a process without gateway.diag_addr records nothing, every recorder is a no-op) and with
 * one (metrics on: recorded, and scraped every second by this process as a Prometheus at a short interval would),
 * the two alternating run by run (which goes first alternates too), daemons restarted for each run. Figures: the
 * single-stream throughput (BENCH_MIB MiB, median of BENCH_METRICS_RUNS runs) and the CPU seconds per GiB of the
 * two daemons; the ratio on/off is the cost.
 */
import getPort from 'get-port';
import { median, sleep } from '../common.js';
import { cpuDelta, cpuSnapshot } from '../lib/proc.js';
import { startGateway } from '../../test/helpers/gateway.js';
import { daemonEnv, startAgent, stopGateway } from './gateway.js';
import { throughputOnce } from './measure.js';
import type { Ends, GatewayPath, Rig } from './paths.js';
import { MIB } from './settings.js';

export const METRICS_RUNS = Number(process.env.BENCH_METRICS_RUNS ?? 5);

type Mode = 'off' | 'on';

export interface MetricsCost {
  rates: Record<Mode, number[]>;
  cpuPerGiB: Record<Mode, number[]>;
  scrapes: number;
}

/** The configuration with gateway.diag_addr added (the first line is `gateway:`). */
function withDiag(yaml: string, port: number): string {
  return yaml.replace(/^gateway:\n/m, `gateway:\n  diag_addr: 127.0.0.1:${port}\n`);
}

/** Scrapes each address's /metrics every second until stopped; resolves with how many scrapes succeeded. */
function scraper(addresses: string[]): { stop(): Promise<number> } {
  let running = true;
  let ok = 0;
  const loop = (async () => {
    while (running) {
      for (const a of addresses) {
        const res = await fetch(`http://${a}/metrics`).catch(() => undefined);
        if (res?.ok) {
          await res.text();
          ok++;
        }
      }
      await sleep(1000);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return ok;
    },
  };
}

async function oneRun(rig: Rig, ends: Ends, gw: GatewayPath, mode: Mode): Promise<{ rate: number; cpu: number; scrapes: number }> {
  await stopGateway(rig.agent);
  rig.agent = undefined;
  await stopGateway(rig.proxy);
  const [proxyDiag, agentDiag] = [await getPort({ host: '127.0.0.1' }), await getPort({ host: '127.0.0.1' })];
  const proxy = (rig.proxy = await startGateway(mode === 'on' ? withDiag(gw.proxyYaml, proxyDiag) : gw.proxyYaml, { dataDir: gw.proxyDataDir, env: daemonEnv() }));
  const agent = (rig.agent = (await startAgent(proxy, mode === 'on' ? withDiag(gw.agentYaml, agentDiag) : gw.agentYaml, gw.agentDataDir, ends.squid, daemonEnv())).agent);
  const scrape = mode === 'on' ? scraper([proxy.addresses.diag!, agent.addresses.diag!]) : undefined;
  await throughputOnce(gw.viaGateway('sink'), ends.sink, 32 * 2 ** 20, 1); // warm-up
  const probe = { 'Proxy daemon': () => [proxy.process.pid!], 'agent daemon': () => [agent.process.pid!] };
  const before = cpuSnapshot(probe);
  const bytes = MIB * 2 ** 20;
  const rate = await throughputOnce(gw.viaGateway('sink'), ends.sink, bytes, 1);
  const used = cpuDelta(before, probe);
  const scrapes = (await scrape?.stop()) ?? 0;
  return { rate, cpu: Object.values(used).reduce((a, b) => a + b, 0) / (bytes / 2 ** 30), scrapes };
}

export async function measureMetricsCost(rig: Rig, ends: Ends, gw: GatewayPath): Promise<MetricsCost> {
  const cost: MetricsCost = { rates: { off: [], on: [] }, cpuPerGiB: { off: [], on: [] }, scrapes: 0 };
  for (let run = 0; run < METRICS_RUNS; run++) {
    const order: Mode[] = run % 2 === 0 ? ['off', 'on'] : ['on', 'off'];
    for (const mode of order) {
      const r = await oneRun(rig, ends, gw, mode);
      cost.rates[mode].push(r.rate);
      cost.cpuPerGiB[mode].push(r.cpu);
      cost.scrapes += r.scrapes;
    }
    rig.say(`metrics run ${run + 1}: off ${cost.rates.off.at(-1)!.toFixed(0)} MiB/s, on ${cost.rates.on.at(-1)!.toFixed(0)} MiB/s`);
  }
  return cost;
}

/** The section of bench/RESULTS.md. */
export function metricsSection(cost: MetricsCost, load: { before: number; after: number }): string {
  const off = median(cost.rates.off);
  const on = median(cost.rates.on);
  const cpuOff = median(cost.cpuPerGiB.off);
  const cpuOn = median(cost.cpuPerGiB.on);
  const pct = (a: number, b: number) => `${(((a - b) / b) * 100).toFixed(1)} %`;
  return [
    `## tunnel-metrics: the cost of metrics on the tunnel's data path (${new Date().toISOString().slice(0, 10)})`,
    '',
    `\`BENCH_TUNNEL_ONLY=metrics npm run bench:tunnel\` (bench/tunnel/metrics.ts): client -> Proxy -> tunnel through squid -> agent -> sink, one stream of ${MIB} MiB, daemons restarted for every run, off and on alternating (${METRICS_RUNS} runs each). Off: no diagnostics listener (nothing is recorded). On: gateway.diag_addr on both daemons, /metrics scraped every second (${cost.scrapes} scrapes). Load average ${load.before.toFixed(2)} before, ${load.after.toFixed(2)} after (other sessions' work on this 2-core machine).`,
    '',
    '| metrics | MiB/s (median) | runs (MiB/s) | CPU-s per GiB, Proxy + agent (median) |',
    '|---|---|---|---|',
    `| off | ${off.toFixed(0)} | ${cost.rates.off.map((r) => r.toFixed(0)).join(' ')} | ${cpuOff.toFixed(2)} |`,
    `| on | ${on.toFixed(0)} | ${cost.rates.on.map((r) => r.toFixed(0)).join(' ')} | ${cpuOn.toFixed(2)} |`,
    '',
    `Throughput with metrics on vs off: ${pct(on, off)}; CPU per GiB: ${pct(cpuOn, cpuOff)} (the issue asks for a cost under 2 %).`,
  ].join('\n');
}
