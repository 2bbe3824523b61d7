/**
 * `gateway dial-plan`: prints the Dialer's decision for each target without dialing, one line (or JSON object)
 * per target, with the reason the decision carries. With --kube-api and --cluster it also prints the decision for
 * the Kubernetes Service's dial of that API server, and both NO_PROXY checks behind it (select.ts, rule 5).
 * When a PAC file decides, it is fetched and asked (no dial is made): its URL, its answer, each entry and the
 * one a dial starts with.
 */
import { formatHostPort } from '../addr.js';
import { Dialer } from '../dial/dialer.js';
import { kubeApiAlias, kubeApiTarget, type ProxyDecision } from '../dial/select.js';
import { GatewayError, toGatewayError } from '../errors.js';

export interface DialPlanOptions {
  json?: boolean;
  kubeApi?: string;
  cluster?: string;
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

function writeText(out: NodeJS.WritableStream, label: string, decision: ProxyDecision, pac: PacPlan | undefined): void {
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

/** Prints the plan; returns false when a target could not be decided (bad target or proxy variable, a PAC that fails). */
export async function dialPlan(targets: readonly string[], opts: DialPlanOptions, out: NodeJS.WritableStream = process.stdout): Promise<boolean> {
  const dialer = new Dialer();
  let ok = true;
  for (const row of rows(targets, opts, dialer)) {
    let decision: ProxyDecision;
    let pac: PacPlan | undefined;
    try {
      decision = row.decide();
      pac = await pacPlan(dialer, decision);
    } catch (err) {
      ok = false;
      const e = toGatewayError(err);
      if (opts.json) out.write(`${JSON.stringify({ target: row.label, ...row.extra, error: { code: e.code, message: e.message } })}\n`);
      else out.write(`${row.label}: error ${e.code}: ${e.message}\n  hint: ${e.hint}\n`);
      continue;
    }
    const checks = decision.checks?.map((c) => ({ target: c.target, what: c.what, no_proxy_entry: c.entry }));
    if (opts.json) {
      const chosenProxy = pac ? (pac.entries.find((e) => e.entry === pac.chosen)?.proxy ?? null) : (decision.proxy?.display ?? null);
      const pacJson = pac ? { pac: { url: pac.url, answer: pac.answer, entries: pac.entries, chosen: pac.chosen, why: pac.why } } : {};
      out.write(`${JSON.stringify({ target: row.label, ...row.extra, proxy: chosenProxy, source: decision.source, reason: decision.reason, ...pacJson, ...(checks ? { checks } : {}) })}\n`);
      continue;
    }
    const what = row.extra?.kube_cluster ? `Kubernetes API server ${row.label} (cluster ${String(row.extra.kube_cluster)})` : row.label;
    writeText(out, what, decision, pac);
    for (const c of checks ?? []) {
      out.write(`  NO_PROXY check of ${c.target} (${c.what}): ${c.no_proxy_entry === null ? 'no entry matches' : `exempt by "${c.no_proxy_entry}"`}\n`);
    }
  }
  return ok;
}
