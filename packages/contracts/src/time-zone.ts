/** Longest accepted zone name, in characters (design §3.3). The longest IANA name today has 32. */
export const MAX_TIME_ZONE_LENGTH = 64;

// The shape of an IANA zone or link name: slash-separated segments, each starting with an upper-case
// letter ("America/Port-au-Prince", "Etc/GMT+5", "EST5EDT", "UTC"). It rules out what ICU accepts but a
// device's tz database would not: UTC offsets ("+01:00"), lower-case spellings ("utc"), empty segments.
const ZONE_NAME_SHAPE = /^[A-Z][A-Za-z0-9_+-]*(?:\/[A-Z][A-Za-z0-9_+-]*)*$/;

// Names proven valid; at most the few hundred zones and links ICU knows, so it cannot grow without bound.
// Rejected names are not cached: they come from callers and could fill memory.
const knownZones = new Set<string>();

/**
 * Whether `name` is an IANA time zone name known to this runtime's ICU data: canonical zones
 * ("Europe/Kyiv") and links ("UTC", "Europe/Kiev", "US/Eastern") are accepted, invented ones
 * ("Mars/Phobos") and offsets are not. Case must match the IANA spelling: "europe/london" is rejected.
 */
export function isIanaTimeZone(name: string): boolean {
  if (knownZones.has(name)) return true;
  if (name.length === 0 || name.length > MAX_TIME_ZONE_LENGTH || !ZONE_NAME_SHAPE.test(name)) {
    return false;
  }
  let resolved: string;
  try {
    resolved = new Intl.DateTimeFormat('en-US', { timeZone: name }).resolvedOptions().timeZone;
  } catch {
    // RangeError: ICU does not know the zone.
    return false;
  }
  // ICU matches names case-insensitively and reports its own spelling; a name that differs from it
  // only by case is a misspelling ("EUROPE/London"). Links resolve to a different name and pass.
  if (resolved !== name && resolved.toLowerCase() === name.toLowerCase()) return false;
  knownZones.add(name);
  return true;
}
