package migrations

// ApplyThese applies those of ms the database lacks, as Apply applies the
// embedded ones.
var ApplyThese = apply
