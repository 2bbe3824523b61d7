/**
 * gwctl autoupdate: the managed rollout as the Auth Service computed it, and the operators' commands
 * (docs/upgrades.md, "Managed rollouts"; the API: GET /v1/autoupdate/status, POST /v1/autoupdate/<command>).
 * Every command prints the status after it acted, so an operator sees what the command did: per group its
 * state and why, its next start in its own time zone, its canaries, its agents counted by version, its stale agents.
 */
import type { Command } from 'commander';
import type { ApiClient } from '../client/api.js';
import { AUTOUPDATE_STATUS_PATH, type RolloutStatus } from '../wire/autoupdate.js';
import { formatOf, formatOption, render, type FormatOptions } from './output.js';
import { table } from './table.js';

/** An ISO instant as local time in zone ("2030-03-04 09:00 Europe/Paris"). */
function inZone(iso: string, zone: string | undefined): string {
  const tz = zone ?? 'UTC';
  try {
    const f = new Intl.DateTimeFormat('sv-SE', { timeZone: tz, year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
    return `${f.format(new Date(iso))} ${tz}`;
  } catch {
    return iso;
  }
}

/** The status as text: the rollout's line, then one block per group. */
export function rolloutText(s: RolloutStatus): string {
  if (!s.managed) return 'Managed rollout: none (no autoupdate_config or autoupdate_version): the upgrade channels and maintenance windows apply';
  const lines = [
    table([
      ['Mode:', s.mode ?? 'enabled'],
      ['Strategy:', s.strategy ?? 'halt-on-error'],
      ['Versions:', s.target_version ? `${s.start_version ?? '?'} -> ${s.target_version}` : 'no target: nothing upgrades until an operator sets one (autoupdate_version)'],
      ...(s.rollout_id ? [['Rollout:', s.rollout_id]] : []),
      ...(s.rollback ? [['Rollback:', `since ${s.rollback.since}${s.rollback.now ? ', all at once' : ''}${s.rollback.group ? `, group ${s.rollback.group}` : ''}`]] : []),
      ...(s.ungrouped !== undefined ? [['Ungrouped:', `${s.ungrouped} agent(s) in no group (catch_all disabled): they never upgrade`]] : []),
    ]),
  ];
  for (const g of s.groups) {
    lines.push('', `Group ${g.name}: ${g.state.toUpperCase()} - ${g.reason}`);
    const facts: string[][] = [];
    if (g.next_start) facts.push(['  Next start:', inZone(g.next_start, g.time_zone)]);
    const versions = Object.entries(g.versions).map(([v, n]) => `${v}: ${n}`).join(', ');
    facts.push(['  Agents:', versions || 'none connected']);
    if (facts.length > 0) lines.push(table(facts));
    if (g.canaries.length > 0) lines.push(table([['  Canary', 'Host ID', 'State', 'Detail'], ...g.canaries.map((c) => [`  ${c.nodename}`, c.host_id, c.state, c.detail ?? ''])]));
    if (g.stale.length > 0) lines.push(`  Stale (upgrader not run for stale_after): ${g.stale.map((a) => `${a.nodename} (${a.host_id}${a.last_run ? `, last run ${a.last_run}` : ', never ran'})`).join(', ')}`);
  }
  return lines.join('\n');
}

/** The `autoupdate` command and its subcommands on gwctl's program. */
export function addAutoupdateCommands(program: Command, client: () => ApiClient, out: (text: string) => void): void {
  const au = program.command('autoupdate').description('the managed rollout of agent upgrades: status, start, suspend, resume, mark-done, rollback (docs/upgrades.md)');
  const print = (format: ReturnType<typeof formatOf>, s: RolloutStatus) => out(format === 'text' ? rolloutText(s) : render(format, s, () => ''));

  formatOption(au.command('status').description('per group: state and why, next start in its time zone, canaries, agents by version, stale agents'))
    .action(async (opts: FormatOptions) => print(formatOf(opts), await client().call<RolloutStatus>('GET', AUTOUPDATE_STATUS_PATH)));

  const commands: Array<[string, string, boolean]> = [
    ['start', 'start a group now, without waiting for its window or the group before it (default: the first group not done)', true],
    ['suspend', 'suspend the rollout: nothing new starts until resume', false],
    ['resume', 'resume a suspended rollout', false],
    ['mark-done', 'mark a group (default: every group) done, so that the next one may start', true],
  ];
  for (const [name, description, group] of commands) {
    const c = au.command(name).description(description);
    if (group) c.option('--group <name>', 'the group');
    formatOption(c).action(async (opts: FormatOptions & { group?: string }) => {
      print(formatOf(opts), await client().call<RolloutStatus>('POST', `/v1/autoupdate/${name}`, { ...(opts.group ? { group: opts.group } : {}) }));
    });
  }
  formatOption(
    au
      .command('rollback')
      .description('move the fleet (or one group) back to start_version through the same groups and canaries; --now: every agent at once, no canaries, no windows (the emergency)')
      .option('--group <name>', 'only this group')
      .option('--now', 'every agent at once: no canaries, no windows'),
  ).action(async (opts: FormatOptions & { group?: string; now?: boolean }) => {
    print(formatOf(opts), await client().call<RolloutStatus>('POST', '/v1/autoupdate/rollback', { ...(opts.group ? { group: opts.group } : {}), ...(opts.now ? { now: true } : {}) }));
  });
}
