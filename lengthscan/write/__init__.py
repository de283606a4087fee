"""Write stage: staging and atomic publish, lengths.parquet, Arrow/Parquet datasets, clean's rows,
truncation, cropping."""
