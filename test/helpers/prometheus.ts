/**
 * Debian's Prometheus, started by a test with its own configuration and a temporary storage directory, scraping
 * the given targets every second; its HTTP API is asked with query(). And promtool, for `check metrics` on a
 * /metrics body (given on its standard input) and `test rules`.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { waitUntil } from './wait.js';

export interface Prometheus {
  url: string;
  /** An instant query's result vector (/api/v1/query). */
  query(expr: string): Promise<Array<{ metric: Record<string, string>; value: [number, string] }>>;
  logs(): string;
  stop(): Promise<void>;
}

/** jobs: job name -> host:port targets serving /metrics. */
export async function startPrometheus(jobs: Record<string, string[]>, options: { ruleFiles?: string[] } = {}): Promise<Prometheus> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-prometheus-'));
  const port = await getPort({ host: '127.0.0.1' });
  const config = [
    'global: { scrape_interval: 1s, evaluation_interval: 1s }',
    ...(options.ruleFiles?.length ? ['rule_files:', ...options.ruleFiles.map((f) => `  - ${JSON.stringify(f)}`)] : []),
    'scrape_configs:',
    ...Object.entries(jobs).flatMap(([job, targets]) => [`  - job_name: ${job}`, `    static_configs: [{ targets: ${JSON.stringify(targets)} }]`]),
    '',
  ].join('\n');
  await writeFile(join(dir, 'prometheus.yml'), config);
  const child = spawn('prometheus', [`--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode === null) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await waitUntil('prometheus ready', async () => (await fetch(`${url}/-/ready`).catch(() => undefined))?.ok === true, 30_000, 200);
  } catch (err) {
    await stop();
    throw new Error(`${(err as Error).message}\n${output}`);
  }
  return {
    url,
    logs: () => output,
    async query(expr) {
      const res = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(expr)}`);
      const body = (await res.json()) as { status: string; error?: string; data: { result: Array<{ metric: Record<string, string>; value: [number, string] }> } };
      if (body.status !== 'success') throw new Error(`query ${expr}: ${body.error}`);
      return body.data.result;
    },
    stop,
  };
}

/** `promtool check metrics` on a /metrics body: its status and what it printed (the problems it found). */
export function promtoolCheckMetrics(body: string): { status: number | null; output: string } {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: body, encoding: 'utf8', timeout: 30_000 });
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

/** `promtool test rules` on the given test files. */
export function promtoolTestRules(files: string[]): { status: number | null; output: string } {
  const r = spawnSync('promtool', ['test', 'rules', ...files], { encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}
