/**
 * `gateway dial-plan`: prints the Dialer's decision for each target without dialing, one line (or JSON object)
 * per target, with the reason the decision carries. With --kube-api and --cluster it also prints the decision for
 * the Kubernetes Service's dial of that API server, and both NO_PROXY checks behind it (select.ts, rule 5).
 * Each target also says which IP family its TCP connection uses, where the plan can know it (family.ts).
 * For a dial through a proxy it says which authentication schemes the client can answer a 407 with (auth/scheme.ts).
 * With --probe it also dials each target and opens TLS (src/dial/probe.ts), and prints the certificate that
 * answered on that path and whether it is the cluster's (--ca FILE, or the host CA of the agent in --data-dir) or
 * "inspected by" another CA.
 * When a PAC file decides, it is fetched and asked (no dial is made): its URL, its answer, each entry and the
 * one a dial starts with.
 */
import { readFileSync } from 'node:fs';
import { formatHostPort } from '../addr.js';
import { describeProxyAuth } from '../dial/auth/scheme.js';
import { Dialer } from '../dial/dialer.js';
import { loadHostIdentity } from '../agent/identity.js';
import { probeTls, type ProbeResult } from '../dial/probe.js';
import { ROOTS_SETTING } from '../dial/upgrade.js';
import { familyLabel, familyPlan } from '../dial/family.js';
import { kubeApiAlias, kubeApiTarget, type ProxyDecision } from '../dial/select.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { formatOf, renderRecord, type Format, type FormatOptions } from './output.js';

export interface DialPlanOptions extends FormatOptions {
  kubeApi?: string;
  cluster?: string;
  /** Dial each target and report the TLS certificate that answers. */
  probe?: boolean;
  /** The cluster's CA (PEM file) for --probe. */
  ca?: string;
  /** A data directory whose host identity (an agent's) gives the cluster's CA for --probe. */
  dataDir?: string;
  /** --probe's deadline per target, in ms. */
  timeout?: string;
}

/** The cluster CAs the probe compares with: --ca, else the agent identity in --data-dir, else none. */
function clusterCas(opts: DialPlanOptions): { pems: string[]; from: string | null } {
  if (opts.ca !== undefined) {
    try {
      return { pems: [readFileSync(opts.ca, 'utf8')], from: opts.ca };
    } catch (err) {
      throw new GatewayError('GW_ERR_USAGE', `--ca ${opts.ca} cannot be read: ${(err as Error).message}`, { hint: "Give the cluster's host CA as a PEM file (an agent keeps it as <data_dir>/host/host-ca.pem)." });
    }
  }
  if (opts.dataDir !== undefined) {
    const identity = loadHostIdentity(opts.dataDir);
    if (!identity) {
      throw new GatewayError('GW_ERR_USAGE', `--data-dir ${opts.dataDir} holds no host identity (${opts.dataDir}/host/identity.json)`, {
        hint: "Give the data directory of an agent that has joined (gateway.data_dir), or the cluster's host CA with --ca FILE.",
      });
    }
    return { pems: [identity.hostCa], from: `${opts.dataDir} (host identity)` };
  }
  return { pems: [], from: null };
}

function probeTimeout(opts: DialPlanOptions): number | undefined {
  if (opts.timeout === undefined) return undefined;
  const ms = Number(opts.timeout);
  if (!Number.isInteger(ms) || ms < 1 || ms > 600_000) throw new GatewayError('GW_ERR_USAGE', `--timeout ${opts.timeout} is not a number of milliseconds from 1 to 600000`, { hint: 'e.g. --timeout 5000' });
  return ms;
}

/** The probe's lines for one target (text form). */
export function probeLines(p: ProbeResult, caFrom: string | null): string[] {
  if (p.error) return [`  probe: error ${p.error.code}: ${p.error.message}`, `    hint: ${p.error.hint}`];
  const leaf = p.chain[0];
  if (!leaf) return [`  probe: TLS to ${p.address} presented no certificate`];
  const lines = [`  probe: TLS to ${p.address} presented ${leaf.subject}, issued by ${leaf.issuer}${p.chain.length > 1 ? ` (chain of ${p.chain.length}, top ${p.verdict.root})` : ''}`];
  if (p.route?.proxy?.auth) lines.push(`  probe: the proxy asked for authentication; answered with ${p.route.proxy.auth}`);
  if (p.verdict.cluster === undefined) lines.push("  probe: the cluster's CA is not known here (--ca FILE or --data-dir DIR), so the certificate is not judged");
  else if (p.verdict.cluster) lines.push(`  probe: issued by the cluster's host CA (from ${caFrom}): not inspected`);
  else if (p.verdict.inspectedBy) {
    lines.push(`  probe: not the cluster's host CA (from ${caFrom}): TLS to ${p.address} is inspected by ${p.verdict.inspectedBy}`);
    lines.push(
      p.upgradeTrusted
        ? `  probe: inspected by ${p.verdict.inspectedBy}, whose root the operator gave: the upgrade transport would be used (the cluster's TLS inside a WebSocket on ${p.address})`
        : `  probe: give ${p.verdict.inspectedBy}'s root certificate in ${ROOTS_SETTING} to use the upgrade transport`,
    );
  } else lines.push(`  probe: not the cluster's host CA (from ${caFrom}), and ${p.route?.proxy ? 'self-signed' : 'no proxy is in the path'}: another server answers at ${p.address}`);
  return lines;
}

function probeJson(p: ProbeResult): Record<string, unknown> {
  if (p.error) return { error: { code: p.error.code, message: p.error.message } };
  const leaf = p.chain[0];
  return {
    subject: leaf?.subject ?? null,
    issuer: leaf?.issuer ?? null,
    root: p.verdict.root ?? null,
    cluster: p.verdict.cluster ?? null,
    inspected_by: p.verdict.inspectedBy ?? null,
    proxy_auth: p.route?.proxy?.auth ?? null,
    upgrade: p.verdict.inspectedBy ? (p.upgradeTrusted ? 'would be used' : 'root not given') : null,
  };
}

interface Row {
  /** The target as the user wrote it. */
  label: string;
  decide: () => ProxyDecision;
  extra?: Record<string, unknown>;
}

function rows(targets: readonly string[], opts: DialPlanOptions, dialer: Dialer): Row[] {
  const out: Row[] = targets.map((target) => ({ label: target, decide: () => dialer.plan(target) }));
  if ((opts.kubeApi === undefined) !== (opts.cluster === undefined)) {
    throw new GatewayError('GW_ERR_USAGE', '--kube-api and --cluster go together', {
      hint: "Give the API server (kube_service.clusters[].api_server) and the gateway cluster's name ('gwctl status' prints it): --kube-api https://10.96.0.1:443 --cluster example.com",
    });
  }
  if (opts.kubeApi !== undefined && opts.cluster !== undefined) {
    const { kubeApi, cluster } = opts;
    out.push({ label: kubeApi, decide: () => dialer.plan(kubeApiTarget(kubeApi), kubeApiAlias(cluster)), extra: { kube_cluster: cluster } });
  }
  if (out.length === 0) throw new GatewayError('GW_ERR_USAGE', 'no target given', { hint: 'Give host:port targets or URLs, or --kube-api with --cluster.' });
  return out;
}

/** The PAC's part of a plan: its URL, its answer for the target, and what each entry becomes. */
interface PacPlan {
  url: string;
  answer: string;
  entries: Array<{ entry: string; proxy: string | null; skipped?: string }>;
  /** The first entry the Dialer can use (null: none), and why it is the one. */
  chosen: string | null;
  why: string;
}

async function pacPlan(dialer: Dialer, decision: ProxyDecision): Promise<PacPlan | undefined> {
  if (!decision.pac) return undefined;
  const res = await dialer.askPac(decision.pac, decision.target);
  const entries = res.steps.map((s) => ({ entry: s.entry.text, proxy: s.proxy?.display ?? null, ...(s.skipped === undefined ? {} : { skipped: s.skipped }) }));
  const first = res.steps.findIndex((s) => s.skipped === undefined);
  const chosen = first < 0 ? null : res.steps[first]!.entry.text;
  const skippedBefore = first > 0 ? `; the entr${first === 1 ? 'y' : 'ies'} before it cannot be used` : '';
  const why =
    first < 0
      ? 'no entry of the answer can be used, so the dial fails (GW_ERR_DIAL_PAC_EXHAUSTED)'
      : `the first usable entry of the answer${skippedBefore}; the dial moves to the next entry only if this one cannot be reached`;
  return { url: res.url, answer: res.answer, entries, chosen, why };
}

/** Prints the plan; resolves false when a target could not be decided (bad target or proxy variable) or probed. */
export async function dialPlan(targets: readonly string[], opts: DialPlanOptions, out: NodeJS.WritableStream = process.stdout, stderr: NodeJS.WritableStream = process.stderr): Promise<boolean> {
  const format = formatOf(opts, { jsonFlag: true }, stderr);
  const dialer = new Dialer();
  const cas = opts.probe ? clusterCas(opts) : { pems: [], from: null };
  const timeoutMs = probeTimeout(opts);
  let ok = true;
  const sink = new RecordSink(out, format);
  for (const row of rows(targets, opts, dialer)) {
    let decision: ProxyDecision;
    let pac: PacPlan | undefined;
    try {
      decision = row.decide();
      pac = await pacPlan(dialer, decision);
    } catch (err) {
      ok = false;
      const e = toGatewayError(err);
      if (sink.structured) sink.write({ target: row.label, ...row.extra, error: { code: e.code, message: e.message } });
      else out.write(`${row.label}: error ${e.code}: ${e.message}\n  hint: ${e.hint}\n`);
      continue;
    }
    const to = formatHostPort(decision.target.host, decision.target.port);
    const probed = opts.probe ? await probeTls(dialer, to, { clusterCas: cas.pems, ...(timeoutMs === undefined ? {} : { timeoutMs }) }) : undefined;
    if (probed?.error) ok = false;
    writeRow(sink, row, decision, { probed, caFrom: cas.from, pac });
  }
  return ok;
}

/** What a row prints besides the decision: the PAC's part, the probe's result. */
interface RowExtras {
  probed: ProbeResult | undefined;
  caFrom: string | null;
  pac: PacPlan | undefined;
}

/** Where the rows go: the text as it is, or each row a record (a JSON line, or a YAML document). */
class RecordSink {
  private first = true;
  constructor(readonly out: NodeJS.WritableStream, private readonly format: Format) {}
  get structured(): boolean {
    return this.format !== 'text';
  }
  write(record: Record<string, unknown>): void {
    if (this.format === 'text') return;
    this.out.write(renderRecord(this.format, record, this.first));
    this.first = false;
  }
}

function writeRow(sink: RecordSink, row: Row, decision: ProxyDecision, extras: RowExtras): void {
  const { probed, caFrom, pac } = extras;
  const out = sink.out;
  const checks = decision.checks?.map((c) => ({ target: c.target, what: c.what, no_proxy_entry: c.entry }));
  // With a PAC the proxy is the answer's chosen entry; its family and authentication are the Dialer's at the dial.
  const family = pac ? undefined : familyPlan(decision);
  const auth = decision.proxy && !pac ? describeProxyAuth(decision.proxy) : null;
  if (sink.structured) {
    const proxy = pac ? (pac.entries.find((e) => e.entry === pac.chosen)?.proxy ?? null) : (decision.proxy?.display ?? null);
    const pacJson = pac ? { pac: { url: pac.url, answer: pac.answer, entries: pac.entries, chosen: pac.chosen, why: pac.why } } : {};
    const familyJson = family ? { family: { family: family.family, reason: family.reason } } : {};
    const probe = probed ? { probe: probeJson(probed) } : {};
    const fields = { proxy, source: decision.source, reason: decision.reason, ...familyJson, proxy_auth: auth, ...pacJson };
    sink.write({ target: row.label, ...row.extra, ...fields, ...(checks ? { checks } : {}), ...probe });
    return;
  }
  const what = row.extra?.kube_cluster ? `Kubernetes API server ${row.label} (cluster ${String(row.extra.kube_cluster)})` : row.label;
  writeHead(out, what, decision, pac);
  if (family) out.write(`  ${familyLabel(family.family)}: ${family.reason}\n`);
  if (auth) out.write(`  proxy authentication: ${auth.reason}\n`);
  for (const e of auth?.each ?? []) out.write(`    ${e.scheme}: ${e.ok ? 'yes' : 'no'}, ${e.why}\n`);
  for (const c of checks ?? []) {
    out.write(`  NO_PROXY check of ${c.target} (${c.what}): ${c.no_proxy_entry === null ? 'no entry matches' : `exempt by "${c.no_proxy_entry}"`}\n`);
  }
  for (const line of probed ? probeLines(probed, caFrom) : []) out.write(`${line}\n`);
}

/** The row's first line, and with a PAC its URL, its answer and each entry. */
function writeHead(out: NodeJS.WritableStream, label: string, decision: ProxyDecision, pac: PacPlan | undefined): void {
  const to = formatHostPort(decision.target.host, decision.target.port);
  if (pac) {
    const step = pac.entries.find((e) => e.entry === pac.chosen);
    const how = step ? (step.proxy ? `through ${step.proxy}` : 'direct') : 'no usable entry';
    out.write(`${label}: ${how} (to ${to}): ${decision.reason}\n`);
    out.write(`  PAC ${pac.url} answers "${pac.answer}"\n`);
    pac.entries.forEach((e, i) => {
      const mark = e.entry === pac.chosen ? `chosen: ${pac.why}` : e.skipped !== undefined ? `skipped: ${e.skipped}` : 'tried next if the one before cannot be reached';
      out.write(`  ${i + 1}. ${e.entry}: ${mark}\n`);
    });
    return;
  }
  const how = decision.proxy ? `through ${decision.proxy.display}` : 'direct';
  out.write(`${label}: ${how} (to ${to}): ${decision.reason}\n`);
}
