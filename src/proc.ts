/** Facts about other processes of this machine, for the locks and pid files that must not be taken twice. */
import { readFileSync } from 'node:fs';

/** Whether a process with this pid exists (EPERM: it exists but belongs to another user). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * When a process started, as Linux records it: field 22 of /proc/<pid>/stat (clock ticks since boot) with this
 * boot's id, e.g. "4821337@6f1c...". A pid is reused once its process is gone; a pid with its start time names
 * one process for good, so a lock that records both cannot be mistaken for another program's. Undefined where
 * /proc cannot tell (another system, or the process is gone).
 */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) is in parentheses and may itself hold ") ": the fields that follow start after the last one.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = fields[19]; // field 22 of the whole line: the 20th after the name and state
    if (!ticks || !/^\d+$/.test(ticks)) return undefined;
    return `${ticks}@${readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim()}`;
  } catch {
    return undefined;
  }
}
